"""Time and peak memory of checking a large dataset file, as the training child does (issue 18, item 4).

    .venv/bin/python bench/data_check.py          # 100 MB files (about half a minute)
    .venv/bin/python bench/data_check.py 20       # 20 MB files

Writes a ShareGPT-like JSON Lines file and the same rows as one JSON array into a
temporary folder, then checks each in a fresh process in two ways: reading alone
(every record parsed, none kept: what the file readers cost; also with the
whole-file reader they replaced, for comparison) and reading and
converting as the child does (`load_local`, which keeps every row). Each process
reports its wall time and how much its peak resident memory grew over the baseline
it had after its imports. Prints a Markdown table; record it in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

MEASURE = """
import json, sys, time
from pathlib import Path
from finetune_studio.training.datasets.files import read_records
from finetune_studio.training.datasets.load import load_local

path, how = Path(sys.argv[1]), sys.argv[2]
def peak() -> int:
    # VmHWM, reset first: ru_maxrss would carry the parent's peak across fork and exec.
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")

Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size
before = peak()
started = time.perf_counter()
if how == "read":
    rows = sum(1 for _ in read_records(path))
elif how == "whole":  # the reader before streaming: the whole text, then json.loads of it or of its lines
    from finetune_studio.training.datasets import files
    text = files._read_text(path)
    if path.suffix == ".json":
        rows = sum(1 for _ in files._json_records(path, text))
    else:
        rows = sum(1 for line in text.splitlines() if json.loads(line))
else:
    rows = len(load_local([str(path)], "auto").rows)
seconds = time.perf_counter() - started
grown = peak() - before
print(json.dumps({"rows": rows, "seconds": seconds, "grown": grown}))
"""


def write_files(folder: Path, megabytes: int) -> list[Path]:
    row = {
        "conversations": [
            {"from": "human", "value": "Explain the difference between a list and a tuple in Python. " * 3},
            {"from": "gpt", "value": 'A list is mutable and a tuple is not; "quotes", lines\nand é ✓ survive. ' * 6},
        ]
    }
    line = json.dumps(row, ensure_ascii=False)
    count = megabytes * 1_000_000 // (len(line.encode()) + 2)
    jsonl, array = folder / "sharegpt.jsonl", folder / "sharegpt.json"
    jsonl.write_text("\n".join([line] * count) + "\n", "utf-8")
    array.write_text("[\n" + ",\n".join([line] * count) + "\n]\n", "utf-8")
    return [jsonl, array]


def main() -> None:
    megabytes = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    print("| file | check | rows | time | peak memory growth | growth / file size |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for path in write_files(Path(folder), megabytes):
            size = path.stat().st_size
            checks = (
                ("whole", "read every record, whole-file reader (before)"),
                ("read", "read every record, streaming reader"),
                ("load", "read and convert (load_local)"),
            )
            for how, label in checks:
                done = subprocess.run(
                    [sys.executable, "-c", MEASURE, str(path), how], capture_output=True, text=True, check=True
                )
                result = json.loads(done.stdout)
                print(
                    f"| {path.suffix}, {size / 1e6:.0f} MB | {label} | {result['rows']:,} | {result['seconds']:.1f} s"
                    f" | {result['grown'] / 2**20:.0f} MB | {result['grown'] / size:.2f}x |"
                )


if __name__ == "__main__":
    main()
