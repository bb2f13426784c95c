"""The terminal views of a job's stream: a rich progress bar, plain lines, or JSON lines.

Every view has the same three methods (`show(event)` for each stream event,
`paused()` around a question to the user, `close()` at the end) and takes the
console or stream it writes to and the clock it reads, so tests render into a
StringIO with a fixed clock and compare the exact text:

    LiveView       a terminal: phase changes as lines above a rich progress bar
                   (step/total, loss and a method's own figures, learning rate,
                   elapsed and the server's ETA)
    LinesView      a pipe or a log file: the same phase lines, and a progress line
                   every few seconds and at the last step
    JsonLinesView  --output-json: one JSON object per event, for scripts

LiveView is a BarView (status lines above a bar redrawn per event), which the
export command's view shares (cli/export_job.py), as its lines view subclasses
LinesView. `make_view` picks one for a command.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Hashable, Iterator
from typing import IO, TYPE_CHECKING, Any, Optional, Protocol, Union

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
)
from rich.text import Text

if TYPE_CHECKING:
    from finetune_studio.cli.client import StreamEvent

Clock = Callable[[], float]


def format_seconds(seconds: Optional[float]) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def _number(value: Any, spec: str) -> str:
    return "-" if value is None else format(float(value), spec)


def loss_text(progress: dict[str, Any]) -> str:
    """The step's loss; "not finite" when the trainer logged NaN or infinity (sent as null)."""
    return "not finite" if progress.get("loss_finite") is False else _number(progress.get("loss"), ".4f")


# A method's figures beside the loss (TrainingProgress.metrics, TRL's names): the
# first that a step has of each slot, as (name, label). The slots are the page's
# first two method charts (web/methodcharts.js: "Rewards", then "Reward accuracy ·
# spread"), each cut to the one figure that says most: DPO's and ORPO's margin and
# accuracy, GRPO's mean reward and its spread; KTO, whose batches may lack the
# pairs a margin needs, its chosen reward and its KL.
METHOD_FIGURES: tuple[tuple[tuple[str, str], ...], ...] = (
    (("rewards/margins", "margin"), ("reward", "reward"), ("rewards/chosen", "chosen")),
    (("rewards/accuracies", "acc"), ("reward_std", "std"), ("kl", "kl")),
)


def method_text(progress: dict[str, Any]) -> str:
    """'margin 0.412  acc 0.75': the method's most telling figures of a step; "" when it has
    none (an SFT step)."""
    metrics = progress.get("metrics") or {}
    shown = []
    for slot in METHOD_FIGURES:
        found = next(((label, metrics[name]) for name, label in slot if metrics.get(name) is not None), None)
        if found is not None:
            shown.append(f"{found[0]} {float(found[1]):.3g}")
    return "  ".join(shown)


def progress_line(progress: dict[str, Any]) -> str:
    """One step's metrics as a line: 'step 15/60  25.0%  loss 2.3125  lr 2.00e-04  eta 01:15',
    with a method's figures after the loss ('loss 0.6931  margin 0.0123  acc 0.5'), then the
    server's recent token rate ('1,234 tok/s') and eval loss where the step has them."""
    method = method_text(progress)
    line = (
        f"step {progress['step']}/{progress['total_steps']}  {float(progress['progress_percent']):5.1f}%"
        f"  loss {loss_text(progress)}{f'  {method}' if method else ''}"
        f"  lr {_number(progress.get('learning_rate'), '.2e')}"
        f"  eta {format_seconds(progress.get('eta_seconds'))}"
    )
    if progress.get("tokens_per_second") is not None:
        line += f"  {float(progress['tokens_per_second']):,.0f} tok/s"
    if progress.get("eval_loss") is not None:
        line += f"  eval_loss {float(progress['eval_loss']):.4f}"
    return line


class StatusLines:
    """A status event as lines: '[phase] message', then its error and any warning not shown before."""

    def __init__(self) -> None:
        self._warnings_shown = 0

    def lines(self, status: dict[str, Any]) -> list[str]:
        details = status.get("details") or {}
        lines = [f"[{status['phase']}] {status['message']}"]
        if status.get("error"):
            code = details.get("error_code")
            lines.append(f"  error{f' ({code})' if code else ''}: {status['error']}")
        warnings = list(details.get("warnings") or [])
        lines.extend(f"  warning: {warning}" for warning in warnings[self._warnings_shown :])
        self._warnings_shown = max(self._warnings_shown, len(warnings))
        return lines


class View(Protocol):
    def show(self, event: StreamEvent) -> None: ...

    def paused(self) -> contextlib.AbstractContextManager[None]: ...

    def close(self) -> None: ...


def _print_plain(console: Console, line: str) -> None:
    # No markup (a message may hold '[...]'), no highlighting, and no wrapping: a
    # line a script reads stays one line.
    console.print(Text(line), soft_wrap=True, highlight=False)


class LinesView:
    """Plain lines for a pipe or a log: every status, and a progress line every `every_seconds` and at the last step.

    A stream whose progress events say something else (an export's stages) subclasses
    it and overrides `line` and `is_last`."""

    def __init__(self, console: Console, *, clock: Clock = time.monotonic, every_seconds: float = 5.0) -> None:
        self.console = console
        self.clock = clock
        self.every_seconds = every_seconds
        self._status = StatusLines()
        self._last_line_at: Optional[float] = None

    @staticmethod
    def percent_and_eta(progress: dict[str, Any], before: str = "") -> str:
        """'  44.1%{before}  eta 00:12': how a plain progress line ends."""
        return f"  {float(progress['progress_percent']):5.1f}%{before}  eta {format_seconds(progress.get('eta_seconds'))}"

    def line(self, progress: dict[str, Any]) -> str:
        """A progress event as one line."""
        return progress_line(progress)

    def is_last(self, progress: dict[str, Any]) -> bool:
        """Whether this progress event ends a run of them (always shown, however soon after the one before)."""
        return bool(progress["step"] >= progress["total_steps"])

    def show(self, event: StreamEvent) -> None:
        if event.kind == "status":
            for line in self._status.lines(event.data):
                _print_plain(self.console, line)
        elif event.kind == "progress":
            now = self.clock()
            last = self.is_last(event.data)
            if self._last_line_at is None or now - self._last_line_at >= self.every_seconds or last:
                _print_plain(self.console, self.line(event.data))
                self._last_line_at = now
        self.console.file.flush()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        yield

    def close(self) -> None:
        self.console.file.flush()


class BarView:
    """What the terminal views share: status lines scroll above a rich `Progress` that each
    progress event redraws. A subclass names the bar's `columns` and says, in `update`,
    which bar an event moves and how."""

    def __init__(self, console: Console, *, clock: Clock = time.monotonic) -> None:
        self.console = console
        self._status = StatusLines()
        self._bars: dict[Hashable, TaskID] = {}
        # Redrawn on each event rather than by a refresh thread: the numbers only
        # change when the server sends an event, and the output stays deterministic.
        self.progress = Progress(
            *self.columns(),
            console=console,
            auto_refresh=False,
            get_time=clock,
            redirect_stdout=False,
            redirect_stderr=False,
            expand=True,
        )
        self._running = False

    def columns(self) -> tuple[Union[str, ProgressColumn], ...]:
        """What a bar shows, left to right."""
        raise NotImplementedError

    def update(self, progress: dict[str, Any]) -> None:
        """Move the bar(s) to what this progress event says (through `move`)."""
        raise NotImplementedError

    @staticmethod
    def bar(*fields: Union[str, ProgressColumn], percent: bool = True) -> tuple[Union[str, ProgressColumn], ...]:
        """The columns every bar starts with (what it is, the bar, done of total, the percent),
        then `fields` (a text naming `{task.fields[...]}`, or a column)."""
        head: tuple[ProgressColumn, ...] = (TextColumn("{task.description}"), BarColumn(bar_width=None), MofNCompleteColumn())
        return (*head, *((TaskProgressColumn(),) if percent else ()),
                *(TextColumn(field) if isinstance(field, str) else field for field in fields))

    def move(self, key: Hashable, description: str, completed: float, total: float, **fields: str) -> None:
        """Move the bar `key` to `completed` of `total`, with `fields` for its text; the first
        event of a key adds its bar, named `description`."""
        blank: dict[str, Any] = dict.fromkeys(fields, "")
        if key not in self._bars:
            self._bars[key] = self.progress.add_task(description, total=total, **blank)
        given: dict[str, Any] = fields
        self.progress.update(self._bars[key], completed=completed, total=total, **given)

    def show(self, event: StreamEvent) -> None:
        if event.kind == "status":
            if event.is_terminal:
                self._stop()
            for line in self._status.lines(event.data):
                # While the bar is live, rich prints these above it.
                self.console.print(Text(line), highlight=False)
        elif event.kind == "progress":
            self.update(event.data)
            if self._running:
                self.progress.refresh()
            else:
                self.progress.start()  # draws it
                self._running = True

    def _stop(self) -> None:
        if self._running:
            self.progress.stop()
            self._running = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Take the bar down while the user answers a question, and draw it again after."""
        was_running = self._running
        self._stop()
        try:
            yield
        finally:
            if was_running:
                self.progress.start()
                self._running = True

    def close(self) -> None:
        self._stop()


class LiveView(BarView):
    """A terminal: phase lines scroll above a rich progress bar that each step redraws."""

    def columns(self) -> tuple[Union[str, ProgressColumn], ...]:
        return self.bar("loss {task.fields[loss]}{task.fields[method]}  lr {task.fields[lr]}"
                        "  {task.fields[elapsed]} elapsed, eta {task.fields[eta]}")

    def update(self, progress: dict[str, Any]) -> None:
        method = method_text(progress)
        self.move("training", "training", progress["step"], progress["total_steps"], loss=loss_text(progress),
                  method=f"  {method}" if method else "", lr=_number(progress.get("learning_rate"), ".2e"),
                  elapsed=format_seconds(progress.get("elapsed_seconds")), eta=format_seconds(progress.get("eta_seconds")))


class JsonLinesView:
    """--output-json: {"event": kind, "id": n, "data": {...}} per line; the command adds a summary line."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def show(self, event: StreamEvent) -> None:
        self.write({"event": event.kind, "id": event.id, "data": event.data})

    def write(self, record: dict[str, Any]) -> None:
        self.out.write(json.dumps(record, separators=(",", ":")) + "\n")
        self.out.flush()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        yield

    def close(self) -> None:
        self.out.flush()


AnyView = Union[BarView, LinesView, JsonLinesView]


def make_view(
    out: IO[str],
    *,
    output_json: bool = False,
    clock: Clock = time.monotonic,
    live: type[BarView] = LiveView,
    lines: type[LinesView] = LinesView,
) -> AnyView:
    """JSON lines when asked; a live bar (`live`) on a terminal; plain lines (`lines`) anywhere else."""
    if output_json:
        return JsonLinesView(out)
    console = Console(file=out)
    if console.is_terminal and not console.is_dumb_terminal:
        return live(console, clock=clock)
    return lines(console, clock=clock)
