"""OpenAI's preference rows as the DPO trainer reads them.

OpenAI: `{"input": {"messages": [...]}, "preferred_output": [{assistant}],
"non_preferred_output": [{assistant}]}`. The trainer (TRL's conversational
preference format, docs/API.md, Training methods): `{"prompt": [...messages], "chosen":
[{assistant}], "rejected": [{assistant}]}`: `conversations.dpo_row`, which the training
child's reader uses too. Written once, when a preference file is uploaded, beside it
(`<id>.dpo.jsonl`); the file is checked first (checks.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from finetune_studio.conversations import dpo_row


def write_dpo_rows(source: Path, target: Path) -> None:
    """Convert a checked preference file, a line at a time, into `target`."""
    with source.open("r", encoding="utf-8") as lines, target.open("w", encoding="utf-8") as out:
        for line in lines:
            if line.strip():
                out.write(json.dumps(dpo_row(json.loads(line)), ensure_ascii=False) + "\n")
