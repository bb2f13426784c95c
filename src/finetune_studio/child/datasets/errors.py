"""The errors a dataset can end a job with, and the codes they carry.

    JobFailure (child/channel.py)
      DatasetError        "dataset_invalid": a source was read but something in it is
                          wrong; names the source, the line or row, and the problem
      JobFailure          "dataset_not_found": hf_dataset names nothing that can be
                          loaded (hub unreachable, not on the hub, gated, no such path)
      JobFailure          "config_invalid": the request's data fields contradict each
                          other (a bad custom_format_mapping, eval_split without
                          hf_dataset, a .txt file with format_type alpaca...)

Inside the package, converters raise `RowProblem` with only the problem and its kind
(a short stable key: missing_field, wrong_type, unknown_role, roles_out_of_order...),
and file readers yield a `BadRecord` for a row they cannot read (bad_json,
wrong_field_count...); the loader adds the source and the location and collects them
in `RowProblems`, which counts every kind, keeps its first MAX_EXAMPLES examples, and
makes the job's error: the first bad row in the usual words, then "N of M rows are
bad (x%): kind n, ...", with `DatasetError.problems` for the status details.

A message quotes what it found in the data (column names, values, a parser's
words) through `quote`, `names` and `first_line`, which keep an excerpt of each and
say how long it was: a 3 MB column name must not become a 3 MB error (it is copied
into the job's status, its stream and every polling answer). `DatasetError` cuts
whatever it is given to MAX_PROBLEM_CHARS as well. A row nested deeper than
Python's parser goes (about 1,000 levels) is reported as NESTED_TOO_DEEPLY at its
line, like any other bad row.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from finetune_studio.bounds import excerpt
from finetune_studio.child.channel import JobFailure

DATASET_INVALID: Final = "dataset_invalid"
DATASET_NOT_FOUND: Final = "dataset_not_found"
CONFIG_INVALID: Final = "config_invalid"

HUB_UNREACHABLE = "cannot reach the Hugging Face hub; name a local folder or file"
NESTED_TOO_DEEPLY = (
    "nested too deeply (lists or objects inside each other past what the JSON parser reads, about 1,000 levels);"
    " a row holds text, or a list of turns"
)

# What a message quotes of a value from the data, and how many names it lists.
QUOTE_CHARS = 80
NAMES_SHOWN = 20
MAX_PROBLEM_CHARS = 2_000
MAX_SOURCE_CHARS = 500
# Of each kind of bad row, how many are quoted (in the error and the status), and how much of each.
MAX_EXAMPLES = 3
MAX_EXAMPLE_CHARS = 300


class DatasetError(JobFailure):
    """`<source>, <where>: <problem>`, e.g. `/data/train.jsonl, line 3: bad JSON (...)`.

    `where` is "line N" (counted from 1, as editors count), "row N" (counted from
    0, as pandas, pyarrow and datasets count), "line N (row M)" for a .json file, or
    "" when the problem is the whole source.
    """

    def __init__(self, source: str | Path, where: str, problem: str) -> None:
        problem = excerpt(problem, MAX_PROBLEM_CHARS)
        shown = excerpt(str(source), MAX_SOURCE_CHARS)
        location = f"{shown}, {where}" if where else shown
        super().__init__(DATASET_INVALID, f"{location}: {problem}")
        self.source = str(source)
        self.where = where
        self.problem = problem
        # For a failure over many bad rows: {kind: {"count", "examples"}} (RowProblems.details).
        self.problems: dict[str, dict[str, Any]] = {}


class RowProblem(Exception):
    """What is wrong with one row, and its kind (a short stable key such as
    "missing_field"); the loader counts it, and names the source and the line."""

    def __init__(self, problem: str, kind: str = "bad_row") -> None:
        super().__init__(problem)
        self.problem = problem
        self.kind = kind


class BadRecord:
    """What a file reader yields in place of a record it could not read (a JSONL line
    that is not JSON, a CSV row with too many fields): one bad row, not a bad file."""

    def __init__(self, problem: str, kind: str) -> None:
        self.problem = problem
        self.kind = kind


class RowProblems:
    """The bad rows of a job's data, by kind: a count and the first few examples of each."""

    def __init__(self) -> None:
        self.first: DatasetError | None = None
        self.counts: dict[str, int] = {}
        self.examples: dict[str, list[dict[str, str]]] = {}

    def add(self, kind: str, source: str, where: str, problem: str) -> None:
        if self.first is None:
            self.first = DatasetError(source, where, problem)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        shown = self.examples.setdefault(kind, [])
        if len(shown) < MAX_EXAMPLES:
            shown.append(
                {
                    "file": excerpt(source, MAX_SOURCE_CHARS),
                    "where": where,
                    "problem": excerpt(problem, MAX_EXAMPLE_CHARS),
                }
            )

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def details(self) -> dict[str, dict[str, Any]]:
        """`{kind: {"count", "examples": [{"file", "where", "problem"}]}}`, most frequent kind first."""
        return {kind: {"count": count, "examples": self.examples[kind]} for kind, count in self.details_counts()}

    def summary(self, rows: int) -> str:
        """"3 of 10,000 rows are bad (0.03%): unknown_role 2, bad_json 1"."""
        kinds = ", ".join(f"{kind} {count:,}" for kind, count in self.details_counts())
        return f"{self.total:,} of {rows:,} rows are bad ({percent(self.total, rows)}): {kinds}"

    def details_counts(self) -> list[tuple[str, int]]:
        """(kind, count), most frequent first (ties in the order first met)."""
        return sorted(self.counts.items(), key=lambda item: -item[1])

    def failure(self, rows: int, advice: str) -> DatasetError:
        """The job's error: the first bad row in the usual words, then the counts and what to do."""
        first = self.first
        if first is None:
            raise ValueError("RowProblems.failure needs at least one problem")
        error = DatasetError(first.source, first.where, first.problem)
        error.message = f"{error.message}. In all, {self.summary(rows)}; {advice}"
        error.args = (error.message,)
        error.problems = self.details()
        return error


def percent(part: int, whole: int) -> str:
    value = 100 * part / whole if whole else 0.0
    return f"{value:.2f}%" if value < 10 else f"{value:.1f}%"


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
    """The first line of an exception's text (an excerpt), or its type's name."""
    text = str(exc).strip()
    return excerpt(text.splitlines()[0], 4 * QUOTE_CHARS) if text else type(exc).__name__


def quote(value: Any) -> str:
    """A value from the data as a message shows it: a string quoted (an excerpt of
    QUOTE_CHARS characters, saying how long it was), a number or true/false/null as
    it is, anything else by its kind ("a list")."""
    if isinstance(value, str):
        if len(value) <= QUOTE_CHARS:
            return repr(value)
        return f"{value[:QUOTE_CHARS]!r}... ({len(value):,} characters)"
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    return kind_of(value)


def names(values: Iterable[Any], *, quoted: bool = False) -> str:
    """Column or key names as a list for a message: "a, b, c" (or "'a', 'b'"), at most
    NAMES_SHOWN of them, each an excerpt; "" for none."""
    items = list(values)
    shown = [
        quote(name) if quoted else excerpt(str(name), QUOTE_CHARS) for name in items[:NAMES_SHOWN]
    ]
    more = f" and {len(items) - NAMES_SHOWN:,} more" if len(items) > NAMES_SHOWN else ""
    return ", ".join(shown) + more
