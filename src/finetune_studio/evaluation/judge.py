"""The `judge` suite: every model answers every prompt; a judge compares each model's answer
with the first model's.

- Prompts: a file of rows in any file type training reads (`training.datasets.files`), each
  with `prompt` (a text, or a list of chat messages) and optionally `reference` (or
  `answer`), a reference answer the judge is shown too; or a conversation (`messages`, as
  held-out data has them), whose last answer is the reference. A row without a prompt is a
  `dataset_invalid` naming its file and line.
- Answers (phase `evaluating`): greedy, `max_new_tokens` at most, through this server's /v1.
- Verdicts (phase `judging`): the judge (a model this server serves, or an external
  OpenAI-compatible endpoint with its key from the server's environment) sees the prompt,
  the reference when there is one, and the two answers as "A" and "B", and answers JSON
  `{"reason", "winner": "A" | "B" | "tie"}`. Each pair is judged twice with the positions
  swapped; the compared model wins a prompt when both verdicts pick it, loses when both pick
  the first model, and ties otherwise (a disagreement is a tie). A verdict that cannot be
  parsed counts as a tie and is counted (`judge/unparsed`). Every verdict keeps its reason.
- Metrics, for every model after the first: win, tie and loss rates (means over the prompts,
  with the paired bootstrap's 95% interval) and the unparsed verdicts' count.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

from finetune_studio.child.channel import JobFailure
from finetune_studio.evaluation.api import OpenAIEndpoint
from finetune_studio.evaluation.common import Context, SuiteResult, clip, run_concurrently
from finetune_studio.evaluation.stats import Estimate, paired_bootstrap

Winner = Literal["A", "B", "tie"]
Outcome = Literal["win", "tie", "loss"]
JUDGE_MAX_TOKENS = 512

SYSTEM = (
    "You are an impartial judge of AI assistants' answers. You are shown a user's prompt{reference_note} and two"
    " answers to it, A and B. Decide which answer is better: more helpful, correct and relevant to the prompt. The"
    " order of the answers, their length and any names in them must not sway you. Reply with one JSON object and"
    ' nothing else: {{"reason": "<one or two sentences>", "winner": "A" or "B" or "tie"}}.'
)


@dataclass
class Prompt:
    messages: list[dict[str, str]]
    reference: Optional[str]


@dataclass
class Verdict:
    winner: Optional[Winner]  # None: the judge's answer could not be parsed (a tie)
    reason: str


def read_prompts(suite: dict[str, Any]) -> list[Prompt]:
    from finetune_studio.child.datasets.errors import DatasetError
    from finetune_studio.child.datasets.files import read_records

    path = Path(str(suite["prompts"])).expanduser()
    prompts: list[Prompt] = []
    limit = suite.get("limit")
    for where, record in read_records(path):
        if limit and len(prompts) >= limit:
            break
        if not isinstance(record, dict):
            raise DatasetError(path, where, getattr(record, "problem", "not an object with a prompt"))
        prompt = record.get("prompt", record.get("question", record.get("instruction", record.get("messages"))))
        reference = record.get("reference", record.get("answer"))
        if "prompt" not in record and isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict) and prompt[-1].get("role") == "assistant":
            # A conversation (chatml rows, as held-out data has them): its last answer is the reference.
            prompt, reference = prompt[:-1], reference if reference is not None else prompt[-1].get("content")
        if isinstance(prompt, str) and prompt.strip():
            messages = [{"role": "user", "content": prompt}]
        elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in prompt):
            messages = [{"role": str(m.get("role", "user")), "content": str(m["content"])} for m in prompt]
        else:
            raise DatasetError(path, where, "no prompt: each row needs `prompt` (a text, or a list of chat messages) or `messages`")
        prompts.append(Prompt(messages, str(reference) if reference not in (None, "") else None))
    if not prompts:
        raise DatasetError(path, "", "no prompts to judge")
    return prompts


def parse_verdict(text: str) -> Verdict:
    """The judge's winner ("A", "B", "tie") and reason; winner None when the answer says neither."""
    found = re.search(r"\{.*\}", text, re.DOTALL)
    if found:
        try:
            data = json.loads(found.group(0))
        except ValueError:
            data = None
        if isinstance(data, dict):
            winner = _winner(str(data.get("winner", "")))
            return Verdict(winner, clip(str(data.get("reason", "")).strip() or text.strip(), 2000))
    marked = re.search(r"\[\[\s*(A|B|C|tie)\s*\]\]", text, re.IGNORECASE) or re.search(
        r"winner\W{0,3}\s*(A|B|tie)\b", text, re.IGNORECASE
    )
    return Verdict(_winner(marked.group(1)) if marked else None, clip(text.strip(), 2000))


def _winner(text: str) -> Optional[Winner]:
    word = text.strip().strip("\"'[]()").lower()
    if word == "a":
        return "A"
    if word == "b":
        return "B"
    if word in ("tie", "c", "draw", "equal", "none"):
        return "tie"
    return None


def outcome(first_as_a: Verdict, first_as_b: Verdict) -> Outcome:
    """The compared model's outcome from the two verdicts (the first model as A, then as B)."""
    picked = {"A": "first", "B": "other"}.get(first_as_a.winner or "tie"), {"A": "other", "B": "first"}.get(first_as_b.winner or "tie")
    if picked == ("other", "other"):
        return "win"
    if picked == ("first", "first"):
        return "loss"
    return "tie"


class Judge:
    def __init__(self, name: str, suite: dict[str, Any], index: int) -> None:
        self.name = name
        self.suite = suite
        self.index = index
        self.prompts = read_prompts(suite)
        self.answers: dict[str, list[str]] = {}

    def samples(self, models: int) -> int:
        """Each model's answer to each prompt, then each compared pair (judged twice)."""
        return len(self.prompts) * models + len(self.prompts) * max(0, models - 1)

    def judge_endpoint(self, ctx: Context) -> OpenAIEndpoint:
        judge = self.suite["judge"]
        if not judge.get("base_url"):
            return ctx.api
        key = ctx.judge_keys.get(str(self.index))
        return OpenAIEndpoint(str(judge["base_url"]), key, name=f"the judge at {judge['base_url']}")

    def evaluate(self, ctx: Context) -> None:
        """Every model's answer to every prompt (phase `evaluating`)."""
        max_tokens = int(self.suite.get("max_new_tokens") or 256)
        for model in ctx.ids:

            def answer(prompt: Prompt, model: str = model) -> str:
                text = ctx.api.chat(model, prompt.messages, max_tokens=max_tokens)
                ctx.progress.advance(self.name, model)
                return text

            self.answers[model] = run_concurrently(self.prompts, answer, ctx.stop)

    def judge(self, ctx: Context) -> SuiteResult:
        """Each model's answers against the first model's, twice each (phase `judging`)."""
        result = SuiteResult()
        models = ctx.ids
        first = models[0]
        endpoint = self.judge_endpoint(ctx)
        judge_model = str(self.suite["judge"]["model"])
        verdicts: dict[str, list[tuple[Verdict, Verdict]]] = {}
        try:
            for model in models[1:]:

                def compare(index: int, model: str = model) -> tuple[Verdict, Verdict]:
                    prompt = self.prompts[index]
                    one = self.ask(endpoint, judge_model, prompt, self.answers[first][index], self.answers[model][index])
                    two = self.ask(endpoint, judge_model, prompt, self.answers[model][index], self.answers[first][index])
                    ctx.progress.advance(self.name, model)
                    return one, two

                verdicts[model] = run_concurrently(list(range(len(self.prompts))), compare, ctx.stop)
        finally:
            if endpoint is not ctx.api:
                endpoint.close()
        ctx.progress.advance(self.name, None, 0, force=True)
        self.metrics(models, verdicts, result)
        result.samples = self.sample_rows(models, verdicts)
        return result

    def ask(self, endpoint: OpenAIEndpoint, model: str, prompt: Prompt, answer_a: str, answer_b: str) -> Verdict:
        note = " and a reference answer" if prompt.reference else ""
        asked = "\n\n".join(f"{m['role']}: {m['content']}" for m in prompt.messages) if len(prompt.messages) > 1 else prompt.messages[0]["content"]
        parts = [f"[Prompt]\n{asked}"]
        if prompt.reference:
            parts.append(f"[Reference answer]\n{prompt.reference}")
        parts += [f"[Answer A]\n{answer_a}", f"[Answer B]\n{answer_b}"]
        messages = [{"role": "system", "content": SYSTEM.format(reference_note=note)}, {"role": "user", "content": "\n\n".join(parts)}]
        try:
            text = endpoint.chat(model, messages, max_tokens=JUDGE_MAX_TOKENS)
        except JobFailure as exc:
            raise JobFailure(exc.error_code, f"judge {model!r}: {exc.message}") from None
        return parse_verdict(text)

    def metrics(self, models: list[str], verdicts: dict[str, list[tuple[Verdict, Verdict]]], result: SuiteResult) -> None:
        compared = models[1:]
        if not compared:
            result.warnings.append(f"{self.name}: a judge compares each model with the first; name two models or more")
            return
        outcomes = {model: [outcome(*pair) for pair in verdicts[model]] for model in compared}
        for kind, higher in (("win", True), ("tie", False), ("loss", False)):
            values = {model: [1.0 if o == kind else 0.0 for o in outcomes[model]] for model in compared}
            estimate = paired_bootstrap(values, models)
            estimate.deltas, estimate.deltas_ci95 = {}, {}  # rates against the first model: no difference from it
            result.add(self.name, f"{kind}_rate", estimate, higher_is_better=higher, samples=len(self.prompts))
        unparsed = Estimate(values={first_or_model: None for first_or_model in models[:1]})
        for model in compared:
            unparsed.values[model] = float(sum((a.winner is None) + (b.winner is None) for a, b in verdicts[model]))
        result.add(self.name, "unparsed", unparsed, higher_is_better=False, samples=2 * len(self.prompts))
        total = sum(int(v or 0) for v in unparsed.values.values())
        if total:
            result.warnings.append(f"{self.name}: {total} of the judge's verdicts could not be parsed; each counted as a tie")

    def sample_rows(self, models: list[str], verdicts: dict[str, list[tuple[Verdict, Verdict]]]) -> list[dict[str, Any]]:
        first = models[0]
        rows = []
        for index, prompt in enumerate(self.prompts):
            verdict: dict[str, Any] = {}
            scores: dict[str, dict[str, float]] = {}
            for model in models[1:]:
                one, two = verdicts[model][index]
                result = outcome(one, two)
                scores[model] = {"win": float(result == "win"), "tie": float(result == "tie"), "loss": float(result == "loss")}
                verdict[model] = {
                    "outcome": result,
                    "verdicts": [
                        {"A": first, "B": model, "winner": one.winner, "parsed": one.winner is not None, "reason": one.reason},
                        {"A": model, "B": first, "winner": two.winner, "parsed": two.winner is not None, "reason": two.reason},
                    ],
                }
            rows.append({
                "suite": self.name,
                "index": index,
                "prompt": clip("\n".join(f"{m['role']}: {m['content']}" for m in prompt.messages)),
                "reference": None if prompt.reference is None else clip(prompt.reference),
                "answers": {model: clip(self.answers[model][index]) for model in models},
                "scores": scores,
                "verdict": verdict,
            })
        return rows
