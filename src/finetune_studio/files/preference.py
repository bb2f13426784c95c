"""OpenAI's preference rows as the DPO trainer reads them.

OpenAI: `{"input": {"messages": [...]}, "preferred_output": [{assistant}],
"non_preferred_output": [{assistant}]}`. The trainer (TRL's conversational
preference format, docs/API.md, Training methods): `{"prompt": [...messages], "chosen":
[{assistant}], "rejected": [{assistant}]}`. Written once, when a preference file is
uploaded, beside it (`<id>.dpo.jsonl`); the file is checked first (checks.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from finetune_studio.files.checks import CHAT_ROLES


def _message(message: dict[str, Any]) -> dict[str, str]:
    content = message["content"]
    if isinstance(content, list):
        content = "".join(str(part["text"]) for part in content)
    return {"role": CHAT_ROLES[str(message["role"])], "content": str(content)}


def dpo_row(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt": [_message(message) for message in row["input"]["messages"]],
        "chosen": [_message(row["preferred_output"][0])],
        "rejected": [_message(row["non_preferred_output"][0])],
    }


def write_dpo_rows(source: Path, target: Path) -> None:
    """Convert a checked preference file, a line at a time, into `target`."""
    with source.open("r", encoding="utf-8") as lines, target.open("w", encoding="utf-8") as out:
        for line in lines:
            if line.strip():
                out.write(json.dumps(dpo_row(json.loads(line)), ensure_ascii=False) + "\n")
