"""The web UI knows every phase and error code the server can send.

`web/format.js` holds the UI's tables (phase order, terminal phases, labels, error
headlines); they are read here as text, so no browser is needed. A code added to
`ErrorCode` in schemas.py without a headline in the UI fails here.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import get_args

from finetune_studio.jobs import phases
from finetune_studio.schemas import ErrorCode, Phase

FORMAT_JS = resources.files("finetune_studio") / "web" / "format.js"
QUOTED = re.compile(r'"([a-z_]+)"')
KEY = re.compile(r"^\s*([a-z_]+)\s*:", re.MULTILINE)


def source() -> str:
    return FORMAT_JS.read_text(encoding="utf-8")


def declaration(pattern: str) -> str:
    """The text of one declaration in format.js (its brackets' inside)."""
    found = re.search(pattern, source(), re.DOTALL)
    assert found, f"web/format.js no longer declares {pattern!r}: update this test with it"
    return found.group(1)


def quoted_list(pattern: str) -> list[str]:
    return QUOTED.findall(declaration(pattern))


def object_keys(name: str) -> set[str]:
    return set(KEY.findall(declaration(rf"const {name} = \{{(.*?)\n\}};")))


def test_the_ui_has_a_headline_for_every_error_code() -> None:
    known = object_keys("ERROR_CODES")
    missing = sorted(set(get_args(ErrorCode)) - known)
    assert not missing, f"web/format.js ERROR_CODES has no headline for: {', '.join(missing)}"
    unknown = sorted(known - set(get_args(ErrorCode)))
    assert not unknown, f"web/format.js ERROR_CODES names codes that schemas.ErrorCode lacks: {', '.join(unknown)}"


def test_the_ui_phases_are_the_servers() -> None:
    running = quoted_list(r"export const PHASES = \[(.*?)\];")
    terminal = quoted_list(r"export const TERMINAL = new Set\(\[(.*?)\]\);")
    # Same phases in the same order: the timeline draws them left to right.
    assert running + terminal == list(get_args(Phase))
    assert set(terminal) == set(phases.TERMINAL)


def test_every_phase_has_a_label() -> None:
    assert object_keys("PHASE_LABELS") == set(get_args(Phase))
