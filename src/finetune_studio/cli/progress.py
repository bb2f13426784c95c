"""The terminal progress view: a bar with step, loss, learning rate and ETA.

`render` is a pure function of the progress payload and a width, so tests compare
exact strings; `ProgressView` decides how to draw (in place on a terminal, one line
per phase and every few seconds otherwise).
"""

from __future__ import annotations

import time
from typing import IO, Any, Callable, Optional

from finetune_studio.cli.client import StreamEvent


def format_seconds(seconds: Optional[float]) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def render(progress: dict[str, Any], width: int = 80) -> str:
    step, total = int(progress["step"]), max(int(progress["total_steps"]), 1)
    text = (
        f" {step}/{total} {progress['progress_percent']:5.1f}%"
        f"  loss {progress['loss']:.4f}  lr {progress['learning_rate']:.2e}"
        f"  eta {format_seconds(progress.get('eta_seconds'))}"
    )
    bar_width = max(10, width - len(text) - 2)
    filled = min(bar_width, int(bar_width * step / total))
    return "[" + "#" * filled + "." * (bar_width - filled) + "]" + text


class ProgressView:
    def __init__(
        self,
        out: IO[str],
        *,
        interactive: bool,
        width: int = 80,
        clock: Callable[[], float] = time.monotonic,
        every_seconds: float = 5.0,
    ) -> None:
        self.out = out
        self.interactive = interactive
        self.width = width
        self.clock = clock
        self.every_seconds = every_seconds
        self._last_line_at: Optional[float] = None
        self._bar_open = False
        self._warnings_shown = 0

    def _end_bar(self) -> None:
        if self._bar_open:
            self.out.write("\n")
            self._bar_open = False

    def show(self, event: StreamEvent) -> None:
        if event.kind == "status":
            self._end_bar()
            data = event.data
            line = f"[{data['phase']}] {data['message']}"
            if data.get("error"):
                line += f"\n  error: {data['error']}"
            warnings = (data.get("details") or {}).get("warnings", [])
            for warning in warnings[self._warnings_shown :]:
                line += f"\n  warning: {warning}"
            self._warnings_shown = max(self._warnings_shown, len(warnings))
            self.out.write(line + "\n")
        elif event.kind == "progress":
            line = render(event.data, self.width)
            if self.interactive:
                self.out.write("\r" + line)
                self._bar_open = True
            else:
                now = self.clock()
                last = event.data["step"] == event.data["total_steps"]
                if self._last_line_at is None or now - self._last_line_at >= self.every_seconds or last:
                    self.out.write(line + "\n")
                    self._last_line_at = now
        self.out.flush()
