"""The one way a test waits for something: poll a predicate, bounded."""

from __future__ import annotations

import time
from typing import Any


def wait_for(predicate: Any, timeout: float = 120, interval: float = 0.05, what: str = "condition") -> Any:
    """Poll predicate until it returns something truthy; bounded so a broken test fails, not hangs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
