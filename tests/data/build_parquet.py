"""Rebuilds the committed .parquet files of this folder: `python tests/data/build_parquet.py`.

Parquet is binary, so the rows they hold are written down here.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent


def turns(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in pairs]


def main() -> None:
    # row 3's output is null
    pq.write_table(
        pa.table(
            {
                "instruction": ["Name a colour.", "Add 2 and 3.", "Name a fruit.", "Name a planet.", "Name a river."],
                "output": ["Blue.", "5", "Apple.", None, "The Nile."],
            }
        ),
        HERE / "bad" / "null_output.parquet",
    )
    # row 1: the assistant answers twice in a row
    pq.write_table(
        pa.table(
            {
                "messages": [
                    turns(("user", "Hi"), ("assistant", "Hello!")),
                    turns(("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello."), ("assistant", "Well?")),
                ]
            }
        ),
        HERE / "bad" / "roles_out_of_order.parquet",
    )
    # custom_format_mapping {"question": "user", "answer": "assistant"}, but the column is "response"
    pq.write_table(
        pa.table({"question": ["What is 2+2?", "Capital of Peru?"], "response": ["4", "Lima"]}),
        HERE / "bad" / "mapped_column_missing.parquet",
    )
    # good: read with custom_format_mapping {"system": "system", "question": "user", "answer": "assistant"}
    pq.write_table(
        pa.table(
            {
                "system": ["You answer in one word.", "", "You answer in one word.", None],
                "question": ["Capital of France?", "What is two plus two?", "Capital of Italy?", "Opposite of hot?"],
                "answer": ["Paris", "Four", "Rome", "Cold"],
                "source": ["atlas", "maths", "atlas", "words"],
            }
        ),
        HERE / "good" / "qa.parquet",
    )


if __name__ == "__main__":
    main()
