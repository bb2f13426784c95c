"""How much checking one dataset file grows a fresh process's peak memory, and how long it takes.

    python bench/peak_memory.py FILE read|load|whole

Run in its own process by bench/data_check.py (the table in docs/BENCHMARKS.md) and
by tests/unit/test_large_files.py (the bounds it holds the readers to), so that both
measure the same way. Prints one JSON line: {"rows": n, "seconds": s, "grown": bytes}.

    read   every record parsed and none kept (`read_records`): what the readers cost
    load   read and converted as the training child does (`load_local`, which keeps every row)
    whole  the whole-file reader the streaming one replaced, for comparison
           (tests/helpers/whole_file_json.py): the whole text, then json.loads of it (a .json
           file) or of each of its lines

Memory is the growth of the peak resident size (VmHWM) over what the process held
after its imports. VmHWM is reset first: ru_maxrss would carry the parent's peak
across fork and exec.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from finetune_studio.child.datasets.files import read_records
from finetune_studio.child.datasets.load import load_local

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for tests/
from tests.helpers.whole_file_json import json_records, whole_text  # noqa: E402


def peak() -> int:
    """The process's peak resident size in bytes (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def count_rows(path: Path, how: str) -> int:
    if how == "read":
        return sum(1 for _ in read_records(path))
    if how == "load":
        return len(load_local([str(path)], "auto").rows)
    if how == "whole":
        text = whole_text(path)
        if path.suffix == ".json":
            return sum(1 for _ in json_records(path, text))
        return sum(1 for line in text.splitlines() if json.loads(line))
    raise SystemExit(f"unknown check {how!r}: read, load or whole")


def main() -> None:
    path, how = Path(sys.argv[1]), sys.argv[2]
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size
    before = peak()
    started = time.perf_counter()
    rows = count_rows(path, how)
    seconds = time.perf_counter() - started
    print(json.dumps({"rows": rows, "seconds": seconds, "grown": peak() - before}))


if __name__ == "__main__":
    main()
