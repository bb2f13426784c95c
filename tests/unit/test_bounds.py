"""finetune_studio.bounds: what one status may carry, whatever it was given."""

from __future__ import annotations

import json
import math
from typing import Any

from finetune_studio.bounds import (
    MAX_DETAILS_BYTES,
    MAX_ERROR_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_WARNING_CHARS,
    MAX_WARNINGS,
    bound_status,
    excerpt,
)


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = [value]
    return value


def test_an_ordinary_status_passes_unchanged() -> None:
    details = {"output_dir": "/data/jobs/abc", "dataset": {"rows": 3, "files": {"/d/a.jsonl": 3}},
               "warnings": ["load_in_4bit needs CUDA"], "train_loss": 1.25}
    assert bound_status("Training completed: 6 steps", None, details) == ("Training completed: 6 steps", None, details)


def test_every_part_of_a_huge_status_is_cut_to_its_limit() -> None:
    details = {
        "warnings": [f"warning {n} " + "w" * 5000 for n in range(10_000)],
        "blob": "b" * 20_000_000,
        "files": {f"/data/file-{n}.jsonl": n for n in range(200_000)},
        "accents": "é" * 100_000,  # six bytes of JSON each
        "loss": float("nan"),
        "deep": nested(5000),  # deeper than Python's JSON encoder goes
        "kept": {"rows": 3},
    }
    message, error, bounded = bound_status("m" * 10_000_000, "e" * 10_000_000, details)

    assert len(message) < MAX_MESSAGE_CHARS + 40 and message.endswith("(10,000,000 characters)")
    assert len(error or "") < MAX_ERROR_CHARS + 40
    text = json.dumps(bounded, allow_nan=False)  # JSON can carry all of it
    assert len(text) <= 2 * MAX_DETAILS_BYTES
    assert bounded["loss"] is None and bounded["kept"] == {"rows": 3}
    assert "(20,000,000 characters)" in bounded["blob"]
    assert any("more keys left out" in str(value) for value in bounded["files"].values())
    assert "left out: nested deeper" in json.dumps(bounded["deep"])
    assert len(bounded["warnings"]) <= MAX_WARNINGS + 1


def test_warnings_are_capped_in_number_and_length_and_the_rest_counted() -> None:
    _, _, bounded = bound_status("", None, {"warnings": ["x" * 5000] + [f"w{n}" for n in range(99)]})
    warnings = bounded["warnings"]
    assert len(warnings) == MAX_WARNINGS
    assert len(warnings[0]) < MAX_WARNING_CHARS + 40 and warnings[0].endswith("(5,000 characters)")
    assert warnings[-1] == "... and 81 more warnings (see the job's worker.log)"


def test_values_that_are_not_json_become_json() -> None:
    _, error, bounded = bound_status("ok", 42, {"inf": -math.inf, "path": object, "list": [math.nan, 1.0]})  # type: ignore[arg-type]
    assert error == "42"
    assert bounded["inf"] is None and bounded["list"] == [None, 1.0] and "class" in bounded["path"]


def test_excerpt_says_how_long_the_text_was() -> None:
    assert excerpt("short", 10) == "short"
    assert excerpt("abcdefghijkl", 3) == "abc... (12 characters)"
