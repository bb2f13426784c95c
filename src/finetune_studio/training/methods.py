"""The trainers of the methods beyond SFT (docs/API.md, Training methods): dpo, orpo, kto, grpo.

The recipe builds the arguments every method shares (steps, batch, optimizer,
schedule, saving, evaluation, CPU or GPU) and hands them here with the checked rows
(`datasets/methods.py`), the LoRA config (None for full fine-tuning) and the shared
callbacks, so phases, stop, checkpoints, resume and progress events are SFT's. It
hands the request, its channel's `warn` and its `facts` (the dict every status
carries), not itself: this module does not import recipe.py, which imports it.

The reference model, which DPO and KTO measure the policy against:

- LoRA: the base itself with the adapter switched off (TRL does this when the model
  is a peft model and no `ref_model` is given); no second copy in memory.
- Full fine-tuning: the reference log-probabilities of every row are computed once,
  before the first step, from the weights as loaded (`precompute_ref_log_probs`), and
  no copy is kept. A resumed job computes them again from the base, not from the
  checkpoint, so the reference stays the base.
- ORPO needs none (its odds-ratio term is reference-free).
- GRPO needs one only when `beta` (its KL penalty) is above 0, for log-probabilities
  of completions sampled at every step, which cannot be computed ahead: with LoRA it
  is the adapter-less base; with full fine-tuning TRL loads a second copy, and the
  job's warnings say so.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional

from finetune_studio.schemas import DEFAULT_BETA

if TYPE_CHECKING:  # the recipe imports this module only once the model is loaded
    from finetune_studio.child.datasets import LoadedData
    from finetune_studio.schemas import TrainingStartRequest

Warn = Callable[[str], None]

DEFAULT_NUM_GENERATIONS = 4
DEFAULT_MAX_COMPLETION_LENGTH = 256


def build_method_trainer(
    request: TrainingStartRequest,
    warn: Warn,
    facts: dict[str, Any],
    common: dict[str, Any],
    model: Any,
    tokenizer: Any,
    data: LoadedData,
    eval_data: Optional[LoadedData],
    peft_config: Any,
    callbacks: list[Any],
) -> Any:
    """The TRL trainer of the request's training_method, ready to `train()`; what it
    chose (beta, the reference model, grpo's sampling) is written into `facts`."""
    from datasets import Dataset

    method = request.training_method
    if request.packing:
        warn(f"packing applies to sft; {method} trains on whole prompt and answer pairs, not packed")
    if request.train_on_completions:
        warn(f"train_on_completions is not needed: {method} learns from the answers only")
    beta = request.beta if request.beta is not None else DEFAULT_BETA[method]
    full = peft_config is None
    rows = list(data.rows)
    if method == "kto":
        # KTO reads its rows in order (each batch's KL estimate pairs neighbours), so a file
        # sorted by label would give batches of one kind: shuffle once, seeded.
        random.Random(request.random_seed).shuffle(rows)  # noqa: S311 - an order, not a secret
    train = Dataset.from_list(rows)
    evaluation = Dataset.from_list(eval_data.rows) if eval_data is not None else None
    parts: dict[str, Any] = {
        "model": model,
        "train_dataset": train,
        "eval_dataset": evaluation,
        "processing_class": tokenizer,
        "peft_config": peft_config,
        "callbacks": callbacks,
    }
    facts.update(training_method=method, beta=beta)

    if method == "dpo":
        from trl import DPOConfig, DPOTrainer

        facts["reference_model"] = _reference(full)
        args = DPOConfig(**common, beta=beta, max_length=request.max_seq_length, precompute_ref_log_probs=full)
        return DPOTrainer(args=args, ref_model=None, **parts)
    if method == "kto":
        from trl import KTOConfig, KTOTrainer

        facts["reference_model"] = _reference(full)
        args = KTOConfig(**common, beta=beta, max_length=request.max_seq_length, precompute_ref_log_probs=full)
        return KTOTrainer(args=args, ref_model=None, **parts)
    if method == "orpo":
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # ORPO lives in trl.experimental in TRL 1.x
        from trl.experimental.orpo import ORPOConfig, ORPOTrainer

        facts["reference_model"] = "none (orpo is reference-free)"
        args = ORPOConfig(**common, beta=beta, max_length=request.max_seq_length, remove_unused_columns=False)
        return ORPOTrainer(args=args, **parts)
    if method == "grpo":
        return _grpo(request, warn, facts, common, beta, full, parts)
    raise ValueError(f"unknown training_method {method!r}")


def _reference(full: bool) -> str:
    if full:
        return "the base model's log-probabilities, computed before the first step"
    return "the base model (the adapter switched off)"


def _grpo(request: TrainingStartRequest, warn: Warn, facts: dict[str, Any], common: dict[str, Any], beta: float,
          full: bool, parts: dict[str, Any]) -> Any:
    from trl import GRPOConfig, GRPOTrainer

    from finetune_studio.training.rewards import build_rewards

    generations = request.num_generations or DEFAULT_NUM_GENERATIONS
    length = request.max_completion_length or DEFAULT_MAX_COMPLETION_LENGTH
    step_batch = request.batch_size * request.gradient_accumulation_steps
    # Each prompt's completions are scored against each other, so a round of sampling must
    # hold whole groups: the smallest multiple of the step's batch that num_generations divides.
    sampled = step_batch * generations // math.gcd(step_batch, generations)
    if sampled != step_batch:
        warn(
            f"grpo samples {sampled} completions a round ({sampled // generations} prompts x num_generations"
            f" {generations}) and trains on them over {sampled // step_batch} steps of batch_size x"
            f" gradient_accumulation_steps = {step_batch}; make that a multiple of num_generations to sample every step"
        )
    if beta > 0:
        if full:
            warn(
                f"grpo with beta {beta:g} and full fine-tuning keeps a second copy of the model in memory as the"
                " reference (its log-probabilities are of completions sampled at every step, so they cannot be"
                " computed ahead); use LoRA, or beta 0, to train without it"
            )
            facts["reference_model"] = "a copy of the base model"
        else:
            facts["reference_model"] = _reference(False)
    else:
        facts["reference_model"] = "none (beta 0: no KL penalty)"
    rewards, weights = build_rewards(request.reward_functions)
    arguments = dict(common)
    if "per_device_eval_batch_size" in arguments:  # an evaluation also compares whole groups
        arguments["per_device_eval_batch_size"] = generations
    args = GRPOConfig(
        **arguments,
        beta=beta,
        num_generations=generations,
        max_completion_length=length,
        generation_batch_size=sampled,
        reward_weights=weights,
    )
    facts.update(num_generations=generations, max_completion_length=length,
                 reward_functions=[reward.__name__ for reward in rewards])
    return GRPOTrainer(args=args, reward_funcs=list(rewards), **parts)
