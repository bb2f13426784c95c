"""The job state machines: each job kind's phases and which changes between them are allowed.

A training job (kind `train`):

    idle --> loading_model --> loading_dataset --> configuring --> training --> completed
     ^ \\            \\                 \\                  \\              \\
     |  `------------`-----------------`------------------`--------------`--> error | stopped
     |                                                                                  |
     `------------------------------ resume (a paused job only) ------------------------'

Pause is a stop that ends `stopped` with `details.paused: true` (its checkpoint
saved); resume is the one edge out of a terminal phase: the same job, queued again
(`idle`), continues from that checkpoint. `JobStore.transition` guards it: only a
status with `details.paused` takes it.

An export (kind `export`, docs/API.md, Export; docs/PHASES.md) takes only the stages its format needs:

    idle --> loading_model --+--> merging ---------+--> completed          (merged_16bit)
                             |       |             |
                             |       v             |
                             +--> converting ------+--> completed          (gguf f16/bf16, lora_gguf)
                                     |
                                     v
                                 quantizing ----------> completed          (gguf k-quants, q8_0)

    and error | stopped from idle and from every running phase.

So `gguf` of a LoRA job goes loading_model -> merging -> converting [-> quantizing];
`gguf` of a full fine-tuning job skips merging; `lora_gguf` goes loading_model ->
converting; `merged_16bit` ends after merging. A child converts every file it
converts before it quantizes any, so there is no edge back from quantizing.

An evaluation (kind `eval`, docs/PHASES.md, Evaluations):

    idle --> loading_model (again) --> evaluating (again per suite) --+--> judging --> completed
                                                                      +--------------> completed

    and error | stopped from idle and from every running phase.

Every phase change in the system goes through `JobStore.transition`, which only
updates a row whose current phase is one its kind's table allows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Optional, get_args

from finetune_studio.schemas import EvalPhase, ExportPhase, Phase

JobKind = Literal["train", "export", "eval"]
KINDS: tuple[str, ...] = get_args(JobKind)

PHASES: tuple[str, ...] = get_args(Phase)
TERMINAL: frozenset[str] = frozenset({"completed", "error", "stopped"})
# The running phases, in the order a job goes through them (the Ray driver drops a
# restarted run's early phases by it; OpenAI's face calls them all `running`).
RUNNING_ORDER: tuple[Phase, ...] = ("loading_model", "loading_dataset", "configuring", "training")
RUNNING: frozenset[str] = frozenset(RUNNING_ORDER)
# How OpenAI's fine-tuning names a training job's end (its job object's `status`, and its
# webhooks' `fine_tuning.job.<end>`): a paused job (`stopped` with details.paused) is no end there.
OPENAI_ENDS: dict[str, str] = {"completed": "succeeded", "error": "failed", "stopped": "cancelled"}


def openai_end(phase: str, details: Optional[dict[str, Any]]) -> Optional[str]:
    """`succeeded`, `failed` or `cancelled` for a training job's terminal phase; `paused` for a
    pause; None for any other phase."""
    if phase == "stopped" and (details or {}).get("paused"):
        return "paused"
    return OPENAI_ENDS.get(phase)

ALLOWED_FROM: dict[str, frozenset[str]] = {
    # target phase: the phases it may be entered from
    # loading_model and training may also be said again with new words: a Ray job
    # waiting for the cluster's resources before it loads, or restarting from its
    # checkpoint after a lost worker (finetune_studio.ray_train.driver).
    "loading_model": frozenset({"idle", "loading_model"}),
    "loading_dataset": frozenset({"loading_model"}),
    "configuring": frozenset({"loading_dataset"}),
    "training": frozenset({"configuring", "training"}),
    "completed": frozenset({"training"}),
    "error": frozenset({"idle"}) | RUNNING,
    "stopped": frozenset({"idle"}) | RUNNING,
    "idle": frozenset({"stopped"}),  # resume: a paused job only (the store's guard)
}
# The phases a training job may be told again with new words (entered from themselves).
REPEATABLE: frozenset[str] = frozenset(target for target, sources in ALLOWED_FROM.items() if target in sources)
# The phases in which a training job has a usable result (a model to export or chat with),
# each with the details one of which must name a saved result (none: the phase is enough):
# a completed job always, a stopped one once it saved its adapter or its model (has_result;
# the page reads it from web/rules.js, generated from here by finetune_studio.web_rules).
RESULT_KEYS: tuple[str, ...] = ("adapter_dir", "model_dir")  # as wire.JobFolder.outputs() names them
RESULT_PHASES: dict[str, tuple[str, ...]] = {"completed": (), "stopped": RESULT_KEYS}

EXPORT_PHASES: tuple[str, ...] = get_args(ExportPhase)
EXPORT_RUNNING: frozenset[str] = frozenset({"loading_model", "merging", "converting", "quantizing"})
EXPORT_ALLOWED_FROM: dict[str, frozenset[str]] = {
    "loading_model": frozenset({"idle"}),
    "merging": frozenset({"loading_model"}),
    "converting": frozenset({"loading_model", "merging"}),
    "quantizing": frozenset({"converting"}),
    "completed": frozenset({"merging", "converting", "quantizing"}),
    "error": frozenset({"idle"}) | EXPORT_RUNNING,
    "stopped": frozenset({"idle"}) | EXPORT_RUNNING,
    # A queued GGUF export waiting for llama.cpp's build says how far it is, again and
    # again, without leaving the queue (supervisor._tools_ready).
    "idle": frozenset({"idle"}),
}

# An evaluation (kind `eval`, docs/PHASES.md, Evaluations): the child checks the models and
# loads what scores them, answers and scores every suite (`evaluating`, said again per suite),
# then has the judge compare the answers (`judging`, judge suites only).
EVAL_PHASES: tuple[str, ...] = get_args(EvalPhase)
EVAL_RUNNING: frozenset[str] = frozenset({"loading_model", "evaluating", "judging"})
EVAL_ALLOWED_FROM: dict[str, frozenset[str]] = {
    "loading_model": frozenset({"idle", "loading_model"}),  # the data read, then the tokenizers loaded
    "evaluating": frozenset({"loading_model", "evaluating"}),
    "judging": frozenset({"evaluating", "judging"}),
    "completed": frozenset({"evaluating", "judging"}),
    "error": frozenset({"idle"}) | EVAL_RUNNING,
    "stopped": frozenset({"idle"}) | EVAL_RUNNING,
}

# Per kind: its phases, its running phases, its table, and the phases that take progress events.
PHASES_OF: dict[str, tuple[str, ...]] = {"train": PHASES, "export": EXPORT_PHASES, "eval": EVAL_PHASES}
RUNNING_OF: dict[str, frozenset[str]] = {"train": RUNNING, "export": EXPORT_RUNNING, "eval": EVAL_RUNNING}
ALLOWED_FROM_OF: dict[str, dict[str, frozenset[str]]] = {
    "train": ALLOWED_FROM, "export": EXPORT_ALLOWED_FROM, "eval": EVAL_ALLOWED_FROM,
}
PROGRESS_PHASES: dict[str, frozenset[str]] = {
    "train": frozenset({"training"}),
    "export": frozenset({"merging", "converting", "quantizing"}),
    "eval": frozenset({"evaluating", "judging"}),
}


def is_terminal(phase: str) -> bool:
    return phase in TERMINAL


def has_result(phase: str, saved: Mapping[str, Any]) -> bool:
    """Whether a training job in `phase` has a usable result (RESULT_PHASES); `saved`: its
    status details, or the results on disk (`wire.JobFolder.outputs()`, the same keys)."""
    needs = RESULT_PHASES.get(phase)
    return needs is not None and (not needs or any(saved.get(key) for key in needs))


def allowed_from(target: str, kind: str = "train") -> frozenset[str]:
    """The phases a job of `kind` may enter `target` from (empty: none leads there)."""
    return ALLOWED_FROM_OF.get(kind, {}).get(target, frozenset())


def can_enter(target: str, current: str, kind: str = "train") -> bool:
    return current in allowed_from(target, kind)
