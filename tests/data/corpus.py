"""What each file of tests/data/bad/ gets wrong, and where the error must point.

Every file in bad/ has an entry here (a test checks it), so the corpus documents
itself: the request fields to read it with, the location the error must name ("" for
a problem with the whole file), and a fragment of the problem text. Every file is
read in-process as a training child reads a job's data
(tests/unit/test_data.py::test_the_bad_corpus, with more cases beside it); two of
them also go through a real server and a real child, as jobs
(tests/integration/test_datasets.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent
BAD = DATA / "bad"
GOOD = DATA / "good"


@dataclass(frozen=True)
class BadFile:
    name: str
    where: str
    problem: str
    fields: dict[str, Any] = field(default_factory=lambda: {"format_type": "auto"})

    @property
    def path(self) -> Path:
        return BAD / self.name


def _format(shape: str) -> dict[str, Any]:
    return {"format_type": shape}


BAD_FILES = [
    # .jsonl
    BadFile("bad_json.jsonl", "line 3", "bad JSON (Expecting value", _format("alpaca")),
    BadFile("missing_output.jsonl", "line 4", "missing the column 'output'", _format("alpaca")),
    BadFile("two_user_turns.jsonl", "line 2", "messages[1] and messages[2] are both user turns", _format("chatml")),
    BadFile(
        "unknown_role.jsonl",
        "line 3",
        "conversations[1].from is 'bot'; expected one of system, human, user, gpt",
        _format("sharegpt"),
    ),
    # .json
    BadFile("wrong_type.json", "line 12 (row 2)", "'output' must be a string, found a number", _format("alpaca")),
    BadFile("json_lines_named_json.json", "line 2", "looks like JSON Lines (one object per line): name it .jsonl"),
    # .csv
    BadFile("field_count.csv", "line 4", "has 5 fields but the header has 3", _format("alpaca")),
    BadFile("latin1.csv", "line 3", "is not valid UTF-8 text (byte 0xe9 at column 11)"),
    # .parquet
    BadFile("null_output.parquet", "row 3", "'output' is empty (null)", _format("alpaca")),
    BadFile(
        "roles_out_of_order.parquet",
        "row 1",
        "messages[2] and messages[3] are both assistant turns",
        _format("chatml"),
    ),
    BadFile(
        "mapped_column_missing.parquet",
        "row 0",
        "missing the column 'answer', which custom_format_mapping maps to assistant",
        {"format_type": "auto", "custom_format_mapping": {"question": "user", "answer": "assistant"}},
    ),
    # .txt
    BadFile("latin1.txt", "line 4", "is not valid UTF-8 text", _format("raw")),
    # the whole file
    BadFile("empty.jsonl", "", "the file is empty"),
    BadFile("header_only.csv", "", "no usable rows"),
    BadFile("sheet.tsv", "", "unsupported file type .tsv"),
]
