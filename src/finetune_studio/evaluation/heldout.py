"""The `heldout` suite: held-out data, scored for every model.

The data is read by training's own loader (`training.datasets.load.load_local`), so any
shape and file type a job trains on is taken, with the same errors (file, line). Each row
is a conversation (or raw text). For every model:

- **loss, perplexity, token accuracy** over the reference answers' tokens: the row is
  rendered with the model's chat template and its assistant turns located exactly as
  `train_on_completions` masks them (`training.completions.assistant_spans`; raw text: all of
  it); `POST /v1/completions` with `echo: true, logprobs: 1, max_tokens: 0` (a group of
  rows in one request, a prompt per row) gives each prompt token's log-probability and
  offset (OpenAI's `choices[].logprobs`), and every token
  that lies inside an answer counts. loss = the tokens' mean negative log-probability (over
  all the suite's answer tokens), perplexity = exp(loss), token accuracy = the share of them
  that are the model's own most likely token (`top_logprobs`). Without the route (a server
  that lacks it), these three are left out, with a warning.
- **the greedy answer** (temperature 0, `POST /v1/chat/completions`) to the conversation up
  to its last assistant turn, against that turn as the reference: exact match (after
  trimming and collapsing whitespace), ROUGE-L F1 (`rouge-score`), and corpus BLEU and chrF
  (`sacrebleu`; per-sample rows carry the sentence scores). Raw text has no answer to give.

Every value has its 95% interval and its difference from the first model its own
(evaluation/stats.py).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from finetune_studio.child.channel import JobFailure
from finetune_studio.evaluation.api import PromptLogprobs
from finetune_studio.evaluation.common import CONCURRENT_REQUESTS, Context, SuiteResult, clip, run_concurrently
from finetune_studio.evaluation.stats import corpus_bootstrap, paired_bootstrap

NO_COMPLETIONS = (
    "loss, perplexity and token_accuracy need POST /v1/completions (with echo and logprobs), which this server does"
    " not have; they are left out"
)


@dataclass
class Row:
    messages: Optional[list[dict[str, Any]]]  # a conversation; None for raw text
    text: Optional[str]  # raw text
    prompt: list[dict[str, Any]] = field(default_factory=list)  # the conversation before its last answer
    reference: Optional[str] = None  # that last answer


@dataclass
class Scores:
    """One row as one model did on it."""

    answer: Optional[str] = None
    nll: float = 0.0  # summed over the row's answer tokens
    tokens: int = 0
    correct: int = 0
    scores: dict[str, float] = field(default_factory=dict)


def read_rows(suite: dict[str, Any]) -> list[Row]:
    """The suite's rows, read and checked by training's loader (its errors name the file and line)."""
    from finetune_studio.child.datasets.load import load_local

    data = load_local([str(Path(name).expanduser()) for name in suite["data"]], suite.get("format_type") or "auto",
                      suite.get("custom_format_mapping"))
    rows = []
    for record in data.rows[: suite.get("limit") or None]:
        messages = record.get("messages")
        if isinstance(messages, list):
            last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
            if last is None:
                rows.append(Row(messages=messages, text=None, prompt=list(messages)))
            else:
                rows.append(Row(messages=messages, text=None, prompt=messages[:last], reference=str(messages[last]["content"])))
        else:
            rows.append(Row(messages=None, text=str(record.get("text", ""))))
    if not rows:
        raise JobFailure("dataset_invalid", f"{', '.join(suite['data'])}: no rows to evaluate")
    return rows


class Heldout:
    def __init__(self, name: str, suite: dict[str, Any]) -> None:
        self.name = name
        self.suite = suite
        self.rows = read_rows(suite)

    def samples(self, models: int) -> int:
        return len(self.rows) * models

    def evaluate(self, ctx: Context) -> SuiteResult:
        result = SuiteResult()
        with_loss = ctx.has_completions()
        if not with_loss:
            result.warnings.append(f"{self.name}: {NO_COMPLETIONS}")
        per_model = {model.id: self.score_model(ctx, model.id, ctx.tokenizers.get(model.id), with_loss) for model in ctx.models}
        ctx.progress.advance(self.name, None, 0, force=True)
        self.metrics(ctx.ids, per_model, result, with_loss)
        result.samples = self.sample_rows(ctx.ids, per_model)
        return result

    def score_model(self, ctx: Context, model: str, tokenizer: Any, with_loss: bool) -> list[Scores]:
        """Every row as one model does on it. The rows go in groups of CONCURRENT_REQUESTS: a
        group's loss passes first, in one request (the chat child prefills them together), then
        its rows' answers, each once its group is scored: an answer's prompt is the start of the
        text its row scored, which the chat child keeps, so it joins the decode batch with no
        prefill (inference/prefix.py). The requests run a few at a time in that order, so the
        next group's loss passes go as the answers before them end, beside the others' decoding."""
        scores = [Scores() for _ in self.rows]
        groups = [range(first, min(first + CONCURRENT_REQUESTS, len(self.rows)))
                  for first in range(0, len(self.rows), CONCURRENT_REQUESTS)]
        scored = [threading.Event() for _ in groups]
        failed: list[bool] = []  # a group's loss pass failed: the evaluation ends (run_concurrently), no more answers
        work: list[tuple[int, Optional[int]]] = []  # (group, None): its loss passes; (group, row): the row's answer
        for number, group in enumerate(groups):
            work.append((number, None))
            work.extend((number, index) for index in group if self.rows[index].reference is not None)

        def run(item: tuple[int, Optional[int]]) -> None:
            number, index = item
            if index is None:
                try:
                    if with_loss:
                        self.score_losses(ctx, model, tokenizer, groups[number], scores)
                except BaseException:
                    failed.append(True)
                    raise
                finally:
                    scored[number].set()
                for done in groups[number]:
                    if self.rows[done].reference is None:  # raw text: nothing to answer
                        ctx.progress.advance(self.name, model)
                return
            scored[number].wait()  # the group's loss item came first in `work`: it is under way or done
            if failed:
                return
            row = self.rows[index]
            answer = ctx.api.chat(model, row.prompt, max_tokens=int(self.suite.get("max_new_tokens") or 128))
            scores[index].answer = answer
            scores[index].scores.update(answer_scores(answer, row.reference or ""))
            ctx.progress.advance(self.name, model)

        run_concurrently(work, run, ctx.stop)
        return scores

    def score_losses(self, ctx: Context, model: str, tokenizer: Any, group: range, scores: list[Scores]) -> None:
        """The loss pass of the rows in `group`, in one request: each row's loss, tokens and token
        accuracy over its reference answers' tokens."""
        asked: list[tuple[int, str, list[tuple[int, int]]]] = []
        for index in group:
            text, spans = self.loss_spans(tokenizer, self.rows[index])
            if spans:
                asked.append((index, text, spans))
        if not asked:
            return
        found = ctx.api.prompt_logprobs(model, [text for _, text, _ in asked])
        for (index, text, spans), logprobs in zip(asked, found, strict=True):
            row = scores[index]
            row.nll, row.tokens, row.correct = answer_token_stats(logprobs, text, spans)
            if row.tokens:
                row.scores.update(loss=row.nll / row.tokens, tokens=float(row.tokens), token_accuracy=row.correct / row.tokens)

    @staticmethod
    def loss_spans(tokenizer: Any, row: Row) -> tuple[str, list[tuple[int, int]]]:
        """The text the model is asked the log-probabilities of, and the spans of it that count."""
        if row.messages is None:
            text = row.text or ""
            return text, [(0, len(text))]
        if tokenizer is None:
            raise JobFailure("model_not_found", "no tokenizer was loaded for a model, so its chat template is unknown")
        from finetune_studio.child.completions import assistant_spans

        return assistant_spans(tokenizer, row.messages)

    def metrics(self, models: list[str], per_model: dict[str, list[Scores]], result: SuiteResult, with_loss: bool) -> None:
        name = self.name
        if with_loss:
            nll = {model: [s.nll for s in rows] for model, rows in per_model.items()}
            tokens = {model: [float(s.tokens) for s in rows] for model, rows in per_model.items()}
            correct = {model: [float(s.correct) for s in rows] for model, rows in per_model.items()}
            counted = int(sum(tokens[models[0]]))
            if counted:
                result.add(name, "loss", paired_bootstrap(nll, models, tokens), higher_is_better=False, samples=len(self.rows))
                result.add(name, "perplexity", paired_bootstrap(nll, models, tokens, transform=_exp), higher_is_better=False,
                           samples=len(self.rows))
                result.add(name, "token_accuracy", paired_bootstrap(correct, models, tokens), higher_is_better=True,
                           samples=len(self.rows))
            else:
                result.warnings.append(f"{name}: no row has an answer's token to score the loss on")
        answered = [index for index, row in enumerate(self.rows) if row.reference is not None]
        if not answered:
            result.warnings.append(f"{name}: the rows are raw text, with no reference answer to compare greedy answers with")
            return
        for metric in ("exact_match", "rouge_l"):
            values = {model: [rows[i].scores[metric] for i in answered] for model, rows in per_model.items()}
            result.add(name, metric, paired_bootstrap(values, models), higher_is_better=True, samples=len(answered))
        hypotheses = {model: [rows[i].answer or "" for i in answered] for model, rows in per_model.items()}
        references = [self.rows[i].reference or "" for i in answered]
        corpus = corpus_bootstrap(hypotheses, references, models)
        result.add(name, "bleu", corpus["bleu"], higher_is_better=True, samples=len(answered))
        result.add(name, "chrf", corpus["chrf"], higher_is_better=True, samples=len(answered))

    def sample_rows(self, models: list[str], per_model: dict[str, list[Scores]]) -> list[dict[str, Any]]:
        rows = []
        for index, row in enumerate(self.rows):
            answers = {model: clip(per_model[model][index].answer) for model in models if per_model[model][index].answer is not None}
            rows.append({
                "suite": self.name,
                "index": index,
                "prompt": clip(prompt_text(row)),
                "reference": None if row.reference is None else clip(row.reference),
                "answers": answers,
                "scores": {model: per_model[model][index].scores for model in models},
            })
        return rows


def _exp(values: Any) -> Any:
    import numpy as np

    return np.exp(values)


def prompt_text(row: Row) -> str:
    """What a row asked, for its per-sample row: the conversation before the answer, one turn a line."""
    if row.messages is None:
        return row.text or ""
    return "\n".join(f"{m['role']}: {m['content']}" for m in row.prompt)


def normalized(text: str) -> str:
    return " ".join(text.split())


_ROUGE: Any = None


def answer_scores(answer: str, reference: str) -> dict[str, float]:
    """One answer against its reference: exact match, ROUGE-L F1, sentence BLEU and chrF."""
    global _ROUGE
    import sacrebleu
    from rouge_score import rouge_scorer

    if _ROUGE is None:
        _ROUGE = rouge_scorer.RougeScorer(["rougeL"])
    return {
        "exact_match": float(normalized(answer) == normalized(reference)),
        "rouge_l": float(_ROUGE.score(reference, answer)["rougeL"].fmeasure),
        "bleu": float(sacrebleu.sentence_bleu(answer, [reference]).score),
        "chrf": float(sacrebleu.sentence_chrf(answer, [reference]).score),
    }


def answer_token_stats(logprobs: PromptLogprobs, text: str, spans: list[tuple[int, int]]) -> tuple[float, int, int]:
    """(summed negative log-probability, tokens, tokens that were the model's most likely) of the
    echoed tokens that lie inside `spans` of `text` (a token counts when it starts and ends within one)."""
    shift = 0
    if logprobs.text != text and logprobs.text.endswith(text):
        shift = len(logprobs.text) - len(text)  # a prefix the server added (a BOS token's text)
    offsets = logprobs.text_offset
    ends = [*offsets[1:], len(logprobs.text)]
    nll, count, correct = 0.0, 0, 0
    for index, logprob in enumerate(logprobs.token_logprobs):
        if logprob is None or index >= len(offsets) or not math.isfinite(logprob):
            continue
        start, end = offsets[index] - shift, ends[index] - shift
        if end <= start or not any(a <= start and end <= b for a, b in spans):
            continue
        nll -= logprob
        count += 1
        top = logprobs.top_logprobs[index] if index < len(logprobs.top_logprobs) else None
        if top and logprob >= max(top.values()) - 1e-6:
            correct += 1
    return nll, count, correct
