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

# Each check runs in a fresh process, measured by peak_memory.py (as the tests measure).
PEAK_MEMORY = Path(__file__).resolve().parent / "peak_memory.py"


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
                    [sys.executable, str(PEAK_MEMORY), str(path), how], capture_output=True, text=True, check=True
                )
                result = json.loads(done.stdout)
                print(
                    f"| {path.suffix}, {size / 1e6:.0f} MB | {label} | {result['rows']:,} | {result['seconds']:.1f} s"
                    f" | {result['grown'] / 2**20:.0f} MB | {result['grown'] / size:.2f}x |"
                )


if __name__ == "__main__":
    main()
