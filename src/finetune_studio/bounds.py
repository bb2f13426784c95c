"""What one job event may carry, and excerpts of text that may be huge.

A status is written by code we run about data we do not control: a dataset's
column names and values, a library's exception text, a request's unknown fields.
Unbounded, one such text is copied into the job's stream, its database row and
every polling answer (a 3 MB column name made every `GET /train/status` 3 MB; a
20 MB one made the child's message too long for the pipe, and the job ended
`worker_died` instead of naming the line). So each status is bounded twice, with
the same function: by the child before it sends (`child/channel.py`), and by
the server before it stores (`jobs/service.py`), since a child's message is
untrusted there.

- `message`: at most MAX_MESSAGE_CHARS; `error`: at most MAX_ERROR_CHARS (room
  for the supervisor's last lines of worker.log).
- `details.warnings`: at most MAX_WARNINGS strings of at most MAX_WARNING_CHARS
  each; more are summarized as one last "... and N more warnings".
- `details` as a whole: at most about MAX_DETAILS_BYTES of JSON. Small values are
  kept whole and the large ones are cut (`shrink`): long strings become excerpts,
  long lists and maps keep their first items and say how many were left out,
  nesting deeper than MAX_DEPTH is left out.
- Numbers that JSON cannot carry (NaN, infinities) become null.

Progress events hold numbers only (the seed's model fixes their fields), so they
need no bound. Plain Python: the server and the children import it.

What a request may name is bounded here too, once for every route:

- every integer a request names that reaches SQLite (an event id, a cursor's
  number, a step) is at most MAX_SQL_INTEGER, SQLite's largest integer (past it,
  the driver raises OverflowError: a 500); `cursor_number` reads a cursor's
  number within it, whatever its length (Python refuses to read more than 4,300
  digits at all);
- a page of a list (`limit`) holds at most MAX_PAGE_ITEMS.
"""

from __future__ import annotations

import json
import math
from typing import Any, Optional

MAX_MESSAGE_CHARS = 2_000
MAX_ERROR_CHARS = 16_000
MAX_WARNINGS = 20
MAX_WARNING_CHARS = 1_000
MAX_DETAILS_BYTES = 32 * 1024
MAX_DEPTH = 8
# A map or list keeps at most this many items when it has to shrink.
MAX_ITEMS = 100
# A shrunk string keeps at least this many characters, and its note (how long
# it was) takes about this many bytes.
_MIN_CHARS, _NOTE_BYTES = 40, 30
# A shrunk map or list keeps only as many items as get this many bytes each.
_MIN_SHARE = 64
# SQLite's integers are signed 64-bit: no id, cursor or step a request names may be larger.
MAX_SQL_INTEGER = 2**63 - 1
# The most items one page of a list answers (`limit`).
MAX_PAGE_ITEMS = 10_000


def cursor_number(digits: str) -> Optional[int]:
    """The number `digits` (decimal digits only) spells, or None when it is past
    MAX_SQL_INTEGER (checked by length first: a megabyte of digits is never parsed)."""
    if not digits.isdigit() or not digits.isascii():
        return None
    digits = digits.lstrip("0") or "0"
    if len(digits) > len(str(MAX_SQL_INTEGER)):
        return None
    number = int(digits)
    return number if number <= MAX_SQL_INTEGER else None


def excerpt(text: str, limit: int) -> str:
    """`text` if it has at most `limit` characters, else its first `limit`
    characters and how long it was: "abc... (3,000,000 characters)"."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def bound_warnings(warnings: Any) -> list[str]:
    """At most MAX_WARNINGS warnings, each at most MAX_WARNING_CHARS characters."""
    items = warnings if isinstance(warnings, list) else [warnings]
    shown = [excerpt(item if isinstance(item, str) else str(item), MAX_WARNING_CHARS) for item in items[:MAX_WARNINGS]]
    if len(items) > MAX_WARNINGS:
        shown[-1] = f"... and {len(items) - MAX_WARNINGS + 1:,} more warnings (see the job's worker.log)"
    return shown


def bound_status(
    message: str, error: Optional[str], details: Optional[dict[str, Any]]
) -> tuple[str, Optional[str], dict[str, Any]]:
    """A status's message, error and details within the limits above."""
    message = excerpt(message if isinstance(message, str) else str(message), MAX_MESSAGE_CHARS)
    if error is not None:
        error = excerpt(error if isinstance(error, str) else str(error), MAX_ERROR_CHARS)
    bounded = dict(details) if isinstance(details, dict) else {}
    if "warnings" in bounded:
        bounded["warnings"] = bound_warnings(bounded["warnings"])
    if json_size(bounded) > MAX_DETAILS_BYTES:
        bounded = fit(bounded, MAX_DETAILS_BYTES)
    return message, error, bounded


def json_size(value: Any) -> float:
    """The length of `value` as compact JSON; infinite when it cannot be JSON as it is
    (a NaN, an object JSON has no type for, nesting Python's encoder refuses), so
    that `shrink` takes it on."""
    try:
        return len(json.dumps(value, separators=(",", ":"), allow_nan=False))
    except (ValueError, TypeError, RecursionError):
        return math.inf


def fit(value: dict[str, Any], budget: int) -> dict[str, Any]:
    """`value` shrunk until its JSON takes at most twice `budget` bytes (the cuts are
    approximate; the guarantee is this loop's)."""
    for attempt in range(6):
        shrunk = shrink(value, budget >> attempt)
        if json_size(shrunk) <= 2 * budget and isinstance(shrunk, dict):
            return shrunk
    return {"left_out": f"these details were over {budget:,} bytes of JSON"}


def shrink(value: Any, budget: int, depth: int = 0) -> Any:
    """A JSON value of about `budget` bytes that keeps as much of `value` as fits.

    The items of a map or list share the budget fairly: those smaller than their
    share are kept whole, and what they leave is shared among the larger ones, which
    are shrunk in turn. Only as many items are kept as get a useful share each.
    """
    if isinstance(value, str):
        size = json_size(value)
        if size <= budget:
            return value
        # Escapes make a character up to 6 bytes of JSON: keep the same fraction of characters.
        keep = int(len(value) * max(budget - _NOTE_BYTES, 0) / size)
        return excerpt(value, max(keep, _MIN_CHARS))
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if not isinstance(value, (dict, list, tuple)):
        return shrink(str(value), budget, depth)
    if depth >= MAX_DEPTH:
        return f"(left out: nested deeper than {MAX_DEPTH} levels)"
    count = max(1, min(len(value), MAX_ITEMS, budget // _MIN_SHARE))
    if isinstance(value, dict):
        names = list(value)[:count]
        keys = [excerpt(str(name), 100) for name in names]
        kept = _share([value[name] for name in names], budget - sum(len(key) + 4 for key in keys), depth)
        result: dict[str, Any] = dict(zip(keys, kept, strict=True))
        if len(value) > count:
            result["..."] = f"{len(value) - count:,} more keys left out"
        return result
    items = _share(list(value[:count]), budget - count, depth)
    if len(value) > count:
        items.append(f"... {len(value) - count:,} more items left out")
    return items


def _share(items: list[Any], budget: int, depth: int) -> list[Any]:
    """Each item whole if it fits its fair share of `budget`, else shrunk to that share."""
    sizes = [json_size(item) for item in items]
    allotted: dict[int, float] = {}
    remaining = float(max(budget, 0))
    left = len(items)
    for index in sorted(range(len(items)), key=sizes.__getitem__):  # smallest first
        allotted[index] = min(sizes[index], remaining / left)
        remaining -= allotted[index]
        left -= 1
    return [
        item if sizes[index] <= allotted[index] else shrink(item, int(allotted[index]), depth + 1)
        for index, item in enumerate(items)
    ]
