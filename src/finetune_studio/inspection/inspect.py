"""A dataset inspected before any job: what a job would make of it, without training.

`inspect_dataset(request, tokenizer)` reads the data exactly as a job reads it
(`load_training_data`: the same sources, checks, conventions and error text) and
reports the shape, the rows, the first rows as the model will see them with the
part that carries the loss marked, token statistics, and every problem, located
as the job's error locates it. The tokenizer (with its chat template) is the
model's when the request names one (`inspection/child.py` loads it; no
weights); without one the preview shows each turn's text and there are no token
statistics. This module imports neither torch nor transformers.

When bad rows would fail the job (bad_rows "error"), the job's error is reported,
and the data is read once more with the bad rows skipped, so that the preview and
the statistics still show what the good rows look like.

Columns that are no known shape get a suggested `custom_format_mapping`, from
their names (`question`/`answer` -> user/assistant, Dolly's `instruction`,
`context`, `response`...), or, for a record of exactly two text columns, the first
as the user's and the second as the assistant's.
"""

from __future__ import annotations

import math
import statistics
from itertools import pairwise
from pathlib import Path
from typing import Any, Optional

from finetune_studio.child.channel import JobFailure
from finetune_studio.child.chat_template import NO_TEMPLATE_WARNING, ensure_chat_template, needs_template
from finetune_studio.child.completions import assistant_spans, render
from finetune_studio.child.datasets.errors import DatasetError
from finetune_studio.child.datasets.files import SUFFIXES, read_records
from finetune_studio.child.datasets.load import LoadedData, load_training_data
from finetune_studio.child.datasets.shapes import detect_shape, mapping_converter
from finetune_studio.child.datasets.stats import token_lengths
from finetune_studio.paths import is_local
from finetune_studio.schemas import (
    DatasetInspection,
    DatasetInspectRequest,
    DatasetProblem,
    PreviewRow,
    PreviewSegment,
    TokenStatistics,
    TrainingStartRequest,
)

# What the preview shows of one row: enough to read a template and an answer, not a book.
PREVIEW_CHARS = 4_000
RAW_COMPLETIONS_WARNING = "train_on_completions needs conversations (not raw text); the loss covers every token"

# Column names (lower case, "_" for spaces and dashes) that say which turn a column
# holds, in the order columns of one role are joined (an instruction before its input).
_ROLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "system": ("system", "system_prompt", "persona"),
    "user": ("instruction", "question", "prompt", "query", "problem", "request", "user", "human",
             "input", "context", "user_input"),
    "assistant": ("output", "answer", "response", "completion", "reply", "assistant", "gpt", "solution",
                  "target", "answers", "best_answer", "model_output"),
}


def inspect_dataset(request: DatasetInspectRequest, tokenizer: Any = None) -> DatasetInspection:
    """The report on `request`'s data; `tokenizer` is the model's (None without model_name)."""
    training = request.training_request()
    report = DatasetInspection(ok=True, max_seq_length=request.max_seq_length, model_name=request.model_name)
    _peek(training, report)
    data: Optional[LoadedData] = None
    lenient = False
    try:
        data = load_training_data(training)
    except JobFailure as exc:
        _failed(report, exc)
        if isinstance(exc, DatasetError) and exc.problems:
            # Bad rows failed it: the good ones are still worth a look.
            with_skips = training.model_copy(update={"bad_rows": "skip", "max_bad_row_fraction": 1.0})
            try:
                data, lenient = load_training_data(with_skips), True
            except JobFailure:
                data = None
    if data is None:
        return report
    _describe(report, data, lenient)
    if not data.is_conversational and request.train_on_completions:
        report.warnings.append(RAW_COMPLETIONS_WARNING)
    # The job's own rule (an inspection has no training type: its rows are what decides).
    if tokenizer is not None and needs_template(data.is_conversational) and ensure_chat_template(tokenizer):
        report.warnings.append(NO_TEMPLATE_WARNING)
    lengths: list[int] = []
    if tokenizer is not None:
        lengths = token_lengths(data, tokenizer)
        report.tokens = token_statistics(lengths)
        report.truncated_rows = sum(1 for n in lengths if n > request.max_seq_length)
    try:
        report.preview = [
            _preview(index, row, tokenizer, request, lengths[index] if lengths else None)
            for index, row in enumerate(data.rows[: request.preview_rows])
        ]
    except JobFailure as exc:  # train_on_completions with a template whose answers cannot be located
        _failed(report, exc)
    if tokenizer is None:
        report.rendered_with = "messages" if data.is_conversational else "text"
    else:
        report.rendered_with = "chat_template" if data.is_conversational else "text"
    return report


def token_statistics(lengths: list[int]) -> Optional[TokenStatistics]:
    """min, mean, percentiles (nearest rank) and max of the tokens per row; None for no rows."""
    if not lengths:
        return None
    ordered = sorted(lengths)

    def rank(share: float) -> float:
        return float(ordered[max(0, math.ceil(share * len(ordered)) - 1)])

    return TokenStatistics(
        min=ordered[0],
        mean=round(statistics.fmean(ordered), 2),
        p50=rank(0.50),
        p90=rank(0.90),
        p95=rank(0.95),
        p99=rank(0.99),
        max=ordered[-1],
        total=sum(ordered),
    )


# -- what went wrong --------------------------------------------------------------


def _failed(report: DatasetInspection, exc: JobFailure) -> None:
    """The job's error, word for word, and its problems one by one."""
    report.ok = False
    if report.error is not None:
        return
    report.error, report.error_code = exc.message, exc.error_code
    if isinstance(exc, DatasetError):
        if exc.problems:
            for kind, found in exc.problems.items():
                report.problem_counts[kind] = int(found["count"])
                report.problems.extend(DatasetProblem(kind=kind, **example) for example in found["examples"])
        else:
            report.problems.append(DatasetProblem(kind="source", file=exc.source, where=exc.where, problem=exc.problem))


def _describe(report: DatasetInspection, data: LoadedData, lenient: bool) -> None:
    report.shape, report.detected, report.shapes = data.shape, data.detected, dict(data.shapes)
    report.rows, report.read, report.per_file = len(data.rows), data.read, dict(data.per_file)
    report.skipped_rows, report.dropped_rows = (0 if lenient else data.skipped_rows), data.dropped_rows
    # Read leniently, the loader's "skipped N bad rows (bad_rows: skip)" is not what the job would do.
    report.warnings.extend(w for w in data.warnings if not (lenient and w.startswith("skipped ")))
    if data.problems and not report.problems:  # bad_rows "skip": the job trains without them, and says so
        for kind, found in data.problems.items():
            report.problem_counts[kind] = int(found["count"])
            report.problems.extend(DatasetProblem(kind=kind, **example) for example in found["examples"])


# -- columns and a suggested mapping --------------------------------------------------


def _peek(request: TrainingStartRequest, report: DatasetInspection) -> None:
    """The first source's columns, and a mapping for the first local file whose columns are no known shape."""
    sources = ([request.hf_dataset] if request.hf_dataset else []) + list(request.local_datasets)
    for position, name in enumerate(sources):
        record = _first_record(name)
        if record is None:
            continue
        if position == 0:
            report.columns = [str(column) for column in record]
        if not request.custom_format_mapping and detect_shape(record) is None:
            report.suggested_mapping = suggest_mapping(record)
            return


def _first_record(name: str) -> Optional[dict[str, Any]]:
    """The first readable record of a local file (not a folder or hub dataset: opening those costs)."""
    if not is_local(name):
        return None
    path = Path(name).expanduser()
    if path.suffix.lower() not in SUFFIXES or not path.is_file():
        return None
    try:
        for _, record in read_records(path):
            if isinstance(record, dict):
                return record
    except (DatasetError, OSError, ValueError, RecursionError):  # the load reports it, located
        return None
    return None


def _key(column: str) -> str:
    return column.strip().lower().replace(" ", "_").replace("-", "_")


def suggest_mapping(record: dict[str, Any]) -> Optional[dict[str, str]]:
    """A custom_format_mapping for a record whose columns are no known shape, or None."""
    texts = [column for column, value in record.items() if isinstance(column, str) and (value is None or isinstance(value, str))]
    found: dict[str, list[tuple[int, str]]] = {role: [] for role in _ROLE_COLUMNS}
    for column in texts:
        for role, words in _ROLE_COLUMNS.items():
            if _key(column) in words:
                found[role].append((words.index(_key(column)), column))
                break
    if found["user"] and found["assistant"]:
        mapping = {column: "system" for _, column in sorted(found["system"])[:1]}
        mapping.update({column: "user" for _, column in sorted(found["user"])})
        mapping[min(found["assistant"])[1]] = "assistant"  # one answer column: two would be joined into one answer
    elif len(texts) == 2:
        mapping = {texts[0]: "user", texts[1]: "assistant"}
    else:
        return None
    try:
        mapping_converter(mapping)  # the mapping a job accepts, or none at all
    except JobFailure:
        return None
    return mapping


# -- the preview ----------------------------------------------------------------------


def _preview(index: int, row: dict[str, Any], tokenizer: Any, request: DatasetInspectRequest, tokens: Optional[int]) -> PreviewRow:
    on_completions = request.train_on_completions
    if "messages" not in row:
        text = str(row["text"])
        eos = getattr(tokenizer, "eos_token", None) if tokenizer is not None else None
        if eos and not text.endswith(eos):  # the trainer appends it: the model learns to stop
            text += eos
        cut = _cut(tokenizer, text, request.max_seq_length, special=True) if tokenizer is not None else None
        return _row(index, text, [(0, len(text), None)], [(0, len(text))], cut, tokens)
    messages: list[dict[str, str]] = row["messages"]
    if tokenizer is None:
        # Each turn's text as the dataset gives it; the template (and its markup) comes with a model.
        segments = [
            PreviewSegment(text=m["content"], role=m["role"], trains=not on_completions or m["role"] == "assistant")
            for m in messages
        ]
        return _clip(PreviewRow(index=index, segments=segments, tokens=tokens))
    text = render(tokenizer, messages)
    turns = _turns(tokenizer, messages, text)
    spans = assistant_spans(tokenizer, messages)[1] if on_completions else [(0, len(text))]
    return _row(index, text, turns, spans, _cut(tokenizer, text, request.max_seq_length, special=False), tokens)


def _turns(tokenizer: Any, messages: list[dict[str, str]], text: str) -> list[tuple[int, int, Optional[str]]]:
    """Each turn's stretch of the rendered text (its markup included), or the whole
    text unlabelled for a template that does not render a conversation's beginning
    as the beginning of the whole."""
    pieces: list[tuple[int, int, Optional[str]]] = []
    start = 0
    for end_at, message in enumerate(messages, start=1):
        upto = render(tokenizer, messages[:end_at])
        if not text.startswith(upto) or len(upto) < start:
            return [(0, len(text), None)]
        pieces.append((start, len(upto), message["role"]))
        start = len(upto)
    if start < len(text):
        pieces.append((start, len(text), None))
    return pieces


def _cut(tokenizer: Any, text: str, max_seq_length: int, *, special: bool) -> Optional[int]:
    """Where in `text` the trainer's truncation at max_seq_length tokens falls, or None when it does not."""
    try:
        encoded = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    except (NotImplementedError, TypeError, ValueError):  # a slow tokenizer has no offsets: no mark
        return None
    offsets = encoded["offset_mapping"]
    if len(offsets) <= max_seq_length:
        return None
    return int(offsets[max_seq_length][0]) or None


def _row(
    index: int,
    text: str,
    turns: list[tuple[int, int, Optional[str]]],
    spans: list[tuple[int, int]],
    cut: Optional[int],
    tokens: Optional[int],
) -> PreviewRow:
    """Segments of `text` at every edge of a turn, of a span the loss covers, and of the truncation."""
    edges = {0, len(text)} | {e for a, b, _ in turns for e in (a, b)} | {e for a, b in spans for e in (a, b)}
    if cut is not None:
        edges.add(cut)
    points = sorted(e for e in edges if 0 <= e <= len(text))
    segments: list[PreviewSegment] = []
    for start, end in pairwise(points):
        if start == end:
            continue
        role = next((r for a, b, r in turns if a <= start < b), None)
        segment = PreviewSegment(
            text=text[start:end],
            role=role,
            trains=any(a <= start and end <= b for a, b in spans),
            truncated=cut is not None and start >= cut,
        )
        last = segments[-1] if segments else None
        if last is not None and (last.role, last.trains, last.truncated) == (role, segment.trains, segment.truncated):
            last.text += segment.text
        else:
            segments.append(segment)
    return _clip(PreviewRow(index=index, segments=segments, tokens=tokens))


def _clip(row: PreviewRow) -> PreviewRow:
    """At most PREVIEW_CHARS characters of a row (a message carries the preview, not a book)."""
    left = PREVIEW_CHARS
    kept: list[PreviewSegment] = []
    for segment in row.segments:
        if left <= 0:
            row.clipped = True
            break
        if len(segment.text) > left:
            segment.text = segment.text[:left]
            row.clipped = True
        left -= len(segment.text)
        kept.append(segment)
    row.segments = kept
    return row
