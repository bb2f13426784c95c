"""A ShareGPT scrape as people download it, mostly good with every known mess
(tests/unit/test_bad_rows.py, tests/integration/test_real_data.py)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

DUMP_ROWS = 10_000


def turn(who: str, text: str) -> dict[str, str]:
    return {"from": who, "value": text}


def pair(n: int) -> list[dict[str, str]]:
    return [turn("human", f"question {n}"), turn("gpt", f"answer {n}")]


class Dump:
    """A ShareGPT scrape as people download it: mostly good, with every known mess."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.cases: Counter[str] = Counter()

    def add(self, case: str, row: dict[str, Any] | str) -> None:
        self.cases[case] += 1
        self.lines.append(row if isinstance(row, str) else json.dumps({"id": f"r{len(self.lines)}", **row}))

    def build(self) -> None:
        assistants = ("chatgpt", "bing", "bard")
        for i in range(DUMP_ROWS):
            if i % 100 == 0:  # a greeting first: FastChat drops it
                self.add("assistant_first", {"conversations": [turn("gpt", "Hi, how can I help?"), *pair(i)]})
            elif i % 100 == 1:
                self.add("empty", {"conversations": []})
            elif i % 100 == 2:
                who = assistants[(i // 100) % 3]
                turns = [turn("system", "Be kind."), turn("Human", "q"), turn(who, "a"), turn("user", "q2")]
                self.add("aliases", {"conversations": [*turns, turn("GPT", "a2")]})
            elif i % 100 == 3:  # an empty system turn and an empty trailing pair of whitespace
                self.add("empty_turns", {"conversations": [turn("system", " "), *pair(i), turn("human", "")]})
            elif i % 100 == 4 and i < 2000:
                self.add("unknown_role", {"conversations": [turn("human", "q"), turn("bot", "a")]})
            elif i == 5:
                self.add("long", {"conversations": [t for n in range(63) for t in pair(n)]})
            elif i % 100 == 6 and i < 3000:
                self.add("missing", {"items": pair(i)})
            elif i % 1000 == 7:
                self.add("bad_json", '{"conversations": [{"from": "human", "value": "cut off')
            elif i % 500 == 8:
                self.add("two_users", {"conversations": [turn("human", "q"), turn("human", "q again"), turn("gpt", "a")]})
            elif i % 100 == 9:  # only the assistant speaks: nothing left once its turn goes
                self.add("assistant_only", {"conversations": [turn("gpt", "Hello?")]})
            else:
                self.add("good", {"conversations": pair(i)})

    def write(self, folder: Path) -> Path:
        self.build()
        path = folder / "sharegpt_dump.jsonl"
        path.write_text("\n".join(self.lines) + "\n")
        return path
