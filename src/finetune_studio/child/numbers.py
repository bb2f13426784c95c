"""The number a text gives: one rule for the `numeric_match` reward (training/rewards.py)
and for checking a dataset's reference answers before training (child/datasets/methods.py)."""

from __future__ import annotations

import math
import re
from typing import Optional

_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def parse_number(text: str) -> Optional[float]:
    """The last number in `text` ("The answer is 1,250." -> 1250.0); None when there is none."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        value = float(found[-1].replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None
