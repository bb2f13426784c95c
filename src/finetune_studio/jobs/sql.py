"""The studio's SQLite file as every store opens and writes it (jobs/store.py's JobStore and
the tables it holds beside the jobs: sweeps, webhooks, accounts; files/store.py's FileStore):
the connection's settings, the one way a payload becomes stored JSON, the one way a
numbered row is added, and the one way a row becomes a record. Plain Python: no FastAPI, no torch."""

from __future__ import annotations

import dataclasses
import functools
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    Record = TypeVar("Record", bound=DataclassInstance)

from finetune_studio.text import clean

# json.dumps writes every non-ASCII character as an escape; surrogates' start so.
_ESCAPED_SURROGATE = "\\ud"


def stored_json(payload: Any) -> str:
    """The one way a payload becomes stored JSON: every job, status and progress write
    passes here. Text that could not be encoded (a lone surrogate quoted from a
    dataset row or a file name) is stored with U+FFFD in its place, so that whatever
    is stored can be served (finetune_studio/text.py)."""
    text = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    if _ESCAPED_SURROGATE in text:  # a lone surrogate, or an escaped pair (an emoji): rare, so check closely only now
        text = json.dumps(clean(payload), separators=(",", ":"), allow_nan=False)
    return text


def stored_text(text: str) -> str:
    """Stored JSON as it may be served: rows written before `stored_json` cleaned text are cleaned as they are read."""
    return stored_json(json.loads(text)) if _ESCAPED_SURROGATE in text else text


def stored_value(text: str) -> Any:
    return json.loads(stored_text(text))


def connect(path: Path) -> sqlite3.Connection:
    """A connection to the studio's database as each store opens it (JobStore; files/'s
    FileStore, on the same file): autocommit, so that every write transaction is an
    explicit `BEGIN IMMEDIATE`; rows read by column name; a lock held by another
    connection waited for up to 5 s rather than failing at once."""
    db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA busy_timeout=5000")
    return db


def matching(equal: dict[str, Any], *always: str) -> tuple[str, list[Any]]:
    """A WHERE clause and its parameters: each of `always` (conditions fixed by the caller), then
    `column = ?` for each entry of `equal` whose value is not None (None: any value). The one way
    a list's filters (owner, kind, purpose, ...) become SQL; the column names are the caller's own."""
    terms = [*always, *(f"{column} = ?" for column, value in equal.items() if value is not None)]
    return " AND ".join(terms) or "1 = 1", [value for value in equal.values() if value is not None]


def insert_next(db: sqlite3.Connection, table: str, row: dict[str, Any]) -> int:
    """Insert `row` into `table` as its newest: `seq`, the order every list is paged in, one
    past the highest. The one way a numbered row is added (jobs, sweeps, files, users, keys,
    webhooks, deliveries); called inside the writer's `BEGIN IMMEDIATE`, so that two writers
    never take one number. Returns the row's `seq`."""
    seq = int(db.execute(f"SELECT COALESCE(MAX(seq), 0) + 1 FROM {table}").fetchone()[0])  # noqa: S608 - our table names
    columns = ", ".join(("seq", *row))
    marks = ", ".join("?" * (len(row) + 1))
    db.execute(f"INSERT INTO {table} ({columns}) VALUES ({marks})", (seq, *row.values()))  # noqa: S608 - our names
    return seq


def record(kind: type[Record], row: sqlite3.Row, **read: Callable[[sqlite3.Row], Any]) -> Record:
    """`kind` (a frozen dataclass) made from `row`: each field is the column of its name, or what
    `read[field](row)` makes of the row where the column differs (JSON, a flag, another name).
    The one way a stored row becomes a record (jobs, files, keys, sweeps, trials, webhooks)."""
    return kind(**{name: read[name](row) if name in read else row[name] for name in _field_names(kind)})


@functools.cache
def _field_names(kind: type[DataclassInstance]) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(kind))  # asked once a kind: lists read many rows


def as_bool(column: str) -> Callable[[sqlite3.Row], bool]:
    """A `record` reader: an INTEGER 0/1 column as a bool."""
    return lambda row: bool(row[column])


def as_json(column: str) -> Callable[[sqlite3.Row], Any]:
    """A `record` reader: a JSON column as its value."""
    return lambda row: json.loads(row[column])
