"""The errors a dataset can end a job with, and the codes they carry.

    JobFailure (training/channel.py)
      DatasetError        "dataset_invalid": a source was read but something in it is
                          wrong; names the source, the line or row, and the problem
      JobFailure          "dataset_not_found": hf_dataset names nothing that can be
                          loaded (hub unreachable, not on the hub, gated, no such path)
      JobFailure          "config_invalid": the request's data fields contradict each
                          other (a bad custom_format_mapping, eval_split without
                          hf_dataset, a .txt file with format_type alpaca...)

Inside the package, converters raise `RowProblem` with only the problem; the loader
adds the source and the location.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from finetune_studio.training.channel import JobFailure

DATASET_INVALID: Final = "dataset_invalid"
DATASET_NOT_FOUND: Final = "dataset_not_found"
CONFIG_INVALID: Final = "config_invalid"

HUB_UNREACHABLE = "cannot reach the Hugging Face hub; name a local folder or file"


class DatasetError(JobFailure):
    """`<source>, <where>: <problem>`, e.g. `/data/train.jsonl, line 3: bad JSON (...)`.

    `where` is "line N" (counted from 1, as editors count), "row N" (counted from
    0, as pandas, pyarrow and datasets count), "line N (row M)" for a .json file, or
    "" when the problem is the whole source.
    """

    def __init__(self, source: str | Path, where: str, problem: str) -> None:
        location = f"{source}, {where}" if where else str(source)
        super().__init__(DATASET_INVALID, f"{location}: {problem}")
        self.source = str(source)
        self.where = where
        self.problem = problem


class RowProblem(Exception):
    """What is wrong with one row; the loader turns it into a DatasetError."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def config_error(message: str) -> JobFailure:
    return JobFailure(CONFIG_INVALID, message)


def kind_of(value: Any) -> str:
    """A value's type in the words of JSON, for messages such as "must be a string, found a number"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    names = {str: "a string", dict: "an object", list: "a list", bytes: "bytes"}
    return next((name for kind, name in names.items() if isinstance(value, kind)), type(value).__name__)


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
