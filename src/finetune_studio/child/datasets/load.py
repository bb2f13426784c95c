"""The entry points: a request's training data and evaluation data, read and checked.

Every source the request names is used: `hf_dataset` first, then the files of
`local_datasets` (or of `local_eval_datasets`), in order. Every record is read and
converted before training. A problem with a whole source (missing, not UTF-8, not
a JSON document, a CSV header) raises `DatasetError` at once; a bad row is counted
by kind (`RowProblems`) and the reading goes on. Then the request's `bad_rows`
policy decides: under "error" any bad row fails the job, naming the first one (its
source, line or row, and problem) and then every kind with its count; under "skip"
the bad rows are left out, counted in `LoadedData`, unless more than
`max_bad_row_fraction` of the rows are bad. Conversations the conventions empty
(`shapes.py`) are left out too, counted, and are not bad rows; what the conventions
did goes into `LoadedData.warnings`. `custom_format_mapping`, when set, reads
every source that has columns (it replaces `format_type`); `auto` detects each
source's shape from its first record, and `LoadedData.shapes` reports the choice.
One job trains on one kind of row: sources that give conversations and sources that
give raw text cannot be mixed.

`dataset_slice_start` / `dataset_slice_end` select rows [start, end) of the
training rows (counted from 0, hf_dataset's rows first); every local file is still
read and checked in full, but of a dataset opened by `datasets` only the selected
rows are read. Evaluation data is never sliced.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from finetune_studio.child.channel import JobFailure
from finetune_studio.child.datasets.errors import (
    DATASET_INVALID,
    NESTED_TOO_DEEPLY,
    BadRecord,
    DatasetError,
    RowProblem,
    RowProblems,
    config_error,
    percent,
)
from finetune_studio.child.datasets.files import TEXT_SUFFIX, Record, read_records
from finetune_studio.child.datasets.hub import HubSplit, open_hf_dataset
from finetune_studio.child.datasets.methods import COLUMNS, METHOD_SHAPES, finish, method_converter, reward_columns
from finetune_studio.child.datasets.shapes import (
    CUSTOM,
    Converter,
    EmptyConversation,
    Notes,
    converter,
    detect_shape,
    mapping_converter,
    undetectable,
)
from finetune_studio.text import invalid_text_locations

if TYPE_CHECKING:
    from finetune_studio.schemas import TrainingStartRequest


@dataclass
class LoadedData:
    """Checked rows, each `{"messages": [...]}` or `{"text": ...}`, and where they came from."""

    rows: list[dict[str, Any]]
    shape: str  # alpaca, sharegpt, chatml, raw or custom; "alpaca+sharegpt" when sources differ
    per_file: dict[str, int] = field(default_factory=dict)  # source -> rows read from it
    shapes: dict[str, str] = field(default_factory=dict)  # source -> the shape it was read as
    detected: bool = False  # format_type was auto, so the shapes are what was detected
    warnings: list[str] = field(default_factory=list)  # for the job's status details
    read: int = 0  # records read, before bad rows and empty conversations were left out
    skipped_rows: int = 0  # bad rows left out under bad_rows "skip"
    dropped_rows: int = 0  # empty conversations left out (a convention, not a bad row)
    problems: dict[str, dict[str, Any]] = field(default_factory=dict)  # skipped rows by kind (RowProblems.details)

    @property
    def is_conversational(self) -> bool:
        return self.shape != "raw"


def load_training_data(request: TrainingStartRequest) -> LoadedData:
    """The training rows of hf_dataset (train_split) and local_datasets, sliced."""
    hub_name = (request.hf_dataset or "").strip()
    files = list(request.local_datasets)
    if not hub_name and not files:
        raise config_error("no training data: set local_datasets (a list of files) or hf_dataset")
    start, end = request.dataset_slice_start, request.dataset_slice_end
    sliced = start is not None or end is not None
    reader = _Reader(request.format_type, request.custom_format_mapping, policy=_policy(request), method=_method(request))
    method = request.training_method
    if method in METHOD_SHAPES and request.format_type != "auto":
        reader.data.warnings.append(
            f"format_type {request.format_type} is not used: training_method {method} reads rows with the columns"
            f" {COLUMNS[METHOD_SHAPES[method]]}"
        )
    if hub_name:
        opened = open_hf_dataset(
            hub_name,
            subset=request.subset,
            split=request.train_split,
            split_field="train_split",
            token=request.hf_token,
        )
        if sliced and not files and isinstance(opened, HubSplit):
            # Of a dataset that may be huge, only the selected rows are read.
            selected = range(len(opened))[start:end]
            if not selected:
                raise _empty_slice(start, end, len(opened))
            reader.add_split(opened, selected.start, selected.stop)
            return reader.result()
        reader.add(opened)
    for name in files:
        reader.add(Path(name).expanduser())
    data = reader.result()
    if sliced:
        total = len(data.rows)
        data.rows = data.rows[start:end]
        if not data.rows:
            raise _empty_slice(start, end, total)
    return data


def _empty_slice(start: int | None, end: int | None, total: int) -> JobFailure:
    return JobFailure(
        DATASET_INVALID,
        f"dataset_slice_start={start} and dataset_slice_end={end} leave no rows (the data has {total} rows)",
    )


def load_eval_data(request: TrainingStartRequest, train: LoadedData | None = None) -> LoadedData | None:
    """The evaluation rows of hf_dataset (eval_split) and local_eval_datasets; None when neither is set.

    Given the training data, evaluation data of the other kind (raw text against
    conversations) is refused.
    """
    split = (request.eval_split or "").strip()
    files = list(request.local_eval_datasets)
    if not split and not files:
        return None
    hub_name = (request.hf_dataset or "").strip()
    if split and not hub_name:
        raise config_error(
            f"eval_split={split!r} names a split of hf_dataset, but hf_dataset is not set;"
            " name evaluation files in local_eval_datasets"
        )
    reader = _Reader(
        request.format_type,
        request.custom_format_mapping,
        purpose="evaluation",
        train=train,
        policy=_policy(request),
        method=_method(request),
    )
    if split:
        reader.add(
            open_hf_dataset(
                hub_name, subset=request.subset, split=split, split_field="eval_split", token=request.hf_token
            )
        )
    for name in files:
        reader.add(Path(name).expanduser())
    return reader.result()


def load_local(paths: list[str], format_type: str, custom_format_mapping: dict[str, str] | None = None) -> LoadedData:
    """Read, check and convert every row of the local files (no slicing)."""
    if not paths:
        raise config_error("local_datasets is empty: name at least one dataset file")
    reader = _Reader(format_type, custom_format_mapping)
    for name in paths:
        reader.add(Path(name).expanduser())
    return reader.result()


class _Reader:
    """Collects converted rows from one source after another, checking that they agree."""

    def __init__(
        self,
        format_type: str,
        mapping: dict[str, str] | None,
        *,
        purpose: str = "training",
        train: LoadedData | None = None,
        policy: tuple[str, float] = ("error", 0.0),
        method: tuple[str, dict[str, str]] = ("sft", {}),
    ) -> None:
        self.format_type = format_type
        # dpo, orpo, kto and grpo read their own rows (methods.py), whatever format_type says.
        self.method = method[0]
        self.method_rows = method_converter(*method)
        self.custom = mapping_converter(mapping) if mapping else None  # the Studio sends {} for none
        self.purpose = purpose
        self.train = train
        self.data = LoadedData(rows=[], shape="", detected=format_type == "auto" and self.custom is None)
        self.bad_rows, self.max_fraction = policy
        self.problems = RowProblems()
        self.notes = Notes()

    def add(self, source: Path | HubSplit) -> None:
        if isinstance(source, HubSplit):
            self.add_split(source)
        else:
            self._add(str(source), read_records(source), is_text=source.suffix.lower() == TEXT_SUFFIX)

    def add_split(self, split: HubSplit, start: int = 0, end: int | None = None) -> None:
        self.data.warnings.extend(split.warnings)
        self._add(split.label, split.records(start, end), is_text=False)

    def _add(self, source: str, records: Iterable[Record], *, is_text: bool) -> None:
        convert: Converter | None = None
        count = 0
        rows = self.data.rows
        for where, record in records:
            count += 1
            if isinstance(record, BadRecord):
                self.problems.add(record.kind, source, where, record.problem)
                continue
            try:
                for place, _, _ in invalid_text_locations(record):
                    # Only JSON can carry it (an escaped lone surrogate); no tokenizer can read it.
                    raise RowProblem(
                        f"{'.'.join(str(part) for part in place)!r} holds text that is not valid Unicode"
                        " (a lone UTF-16 surrogate, \\ud800-\\udfff, escaped in the JSON); fix or remove it",
                        "invalid_unicode",
                    )
                if convert is None:
                    convert = self._choose(source, where, record, is_text)
                rows.append(convert(record, self.notes))
            except RowProblem as problem:
                self.problems.add(problem.kind, source, where, problem.problem)
            except EmptyConversation:
                self.data.dropped_rows += 1
            except RecursionError:  # nesting past what Python's parser (or a check of every value) goes through
                self.problems.add("nested_too_deeply", source, where, NESTED_TOO_DEEPLY)
        if count == 0:
            raise DatasetError(source, "", "no usable rows: it holds no records")
        self.data.read += count
        self.data.per_file[source] = self.data.per_file.get(source, 0) + count

    def _choose(self, source: str, where: str, record: dict[str, Any], is_text: bool) -> Converter:
        """The shape of this source, decided at its first record; checked against the others."""
        if self.method_rows is not None:
            shape = METHOD_SHAPES[self.method]
            if is_text:
                raise DatasetError(
                    source,
                    "",
                    f"a .txt file holds raw text; training_method {self.method} reads rows with the columns"
                    f" {COLUMNS[shape]} (.jsonl, .json, .csv or .parquet)",
                )
            self.data.shapes[source] = self.data.shape = shape
            return self.method_rows
        if is_text:
            if self.custom is not None:
                raise config_error(
                    f"{source} is a .txt file (raw text); custom_format_mapping needs a file with columns"
                )
            if self.format_type not in ("raw", "auto"):
                raise DatasetError(
                    source,
                    "",
                    "a .txt file holds raw text (one row per paragraph);"
                    f" use format_type raw or auto, not {self.format_type}",
                )
            shape = "raw"
        elif self.custom is not None:
            shape = CUSTOM
        elif self.format_type == "auto":
            detected = detect_shape(record)
            if detected is None:
                raise DatasetError(source, where, undetectable(record))
            shape = detected
        else:
            shape = self.format_type
        self._check_kind(source, shape)
        self.data.shapes[source] = shape
        names = list(dict.fromkeys(self.data.shapes.values()))
        self.data.shape = "+".join(names)
        return self.custom if shape == CUSTOM and self.custom is not None else converter(shape)

    def _check_kind(self, source: str, shape: str) -> None:
        def kind(is_raw: bool) -> str:
            return "raw text" if is_raw else "conversations"

        if self.data.shapes:
            first_source, first_shape = next(iter(self.data.shapes.items()))
            if (shape == "raw") != (first_shape == "raw"):
                raise DatasetError(
                    source,
                    "",
                    f"holds {kind(shape == 'raw')} ({shape}) but {first_source} holds {kind(first_shape == 'raw')}"
                    f" ({first_shape}); one job trains on one kind of data",
                )
        elif self.train is not None and (shape == "raw") != (not self.train.is_conversational):
            raise DatasetError(
                source,
                "",
                f"the {self.purpose} data is {kind(shape == 'raw')} ({shape}) but the training data is"
                f" {kind(not self.train.is_conversational)} ({self.train.shape})",
            )

    def result(self) -> LoadedData:
        """The rows, once the bad-row policy has been applied and the conventions said."""
        data, problems = self.data, self.problems
        data.warnings.extend(self.notes.warnings())
        bad = problems.total
        if bad:
            fraction = bad / data.read
            if self.bad_rows != "skip":
                raise problems.failure(data.read, 'set bad_rows: "skip" to train without them')
            if fraction > self.max_fraction:
                raise problems.failure(
                    data.read,
                    f"that is more than max_bad_row_fraction allows ({self.max_fraction:g},"
                    f" {100 * self.max_fraction:g}%); fix the rows, or raise max_bad_row_fraction",
                )
            data.skipped_rows = bad
            data.problems = problems.details()
            data.warnings.append(
                f"skipped {bad:,} bad rows of {data.read:,} ({percent(bad, data.read)}) in the {self.purpose} data"
                f" (bad_rows: skip): {', '.join(f'{k} {n:,}' for k, n in problems.details_counts())}"
            )
        finish(self.method, data.per_file, data.rows)
        if not data.rows and data.read:
            parts = [(data.dropped_rows, "empty conversations"), (bad, "bad rows")]
            left_out = " and ".join(f"{count:,} {what}" for count, what in parts if count)
            raise DatasetError(
                ", ".join(data.per_file),
                "",
                f"no usable rows: all {data.read:,} rows were left out ({left_out})",
            )
        return data


def _policy(request: TrainingStartRequest) -> tuple[str, float]:
    return request.bad_rows, request.max_bad_row_fraction


def _method(request: TrainingStartRequest) -> tuple[str, dict[str, str]]:
    """The training method, and the columns its rewards read (grpo)."""
    return request.training_method, reward_columns(request.reward_functions)
