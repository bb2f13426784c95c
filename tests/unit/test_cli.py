"""The terminal view and the SSE parser, compared as exact text."""

from __future__ import annotations

import io

from finetune_studio.cli.client import StreamEvent, parse_sse
from finetune_studio.cli.progress import ProgressView, format_seconds, render

PROGRESS = {"step": 15, "total_steps": 60, "loss": 2.3125, "learning_rate": 2e-4, "progress_percent": 25.0, "eta_seconds": 75.4}


def test_render_draws_a_bar_with_loss_lr_and_eta() -> None:
    line = render(PROGRESS, width=80)
    assert len(line) == 80
    assert line.endswith(" 15/60  25.0%  loss 2.3125  lr 2.00e-04  eta 01:15")
    bar = line[1 : line.index("]")]
    assert bar.count("#") == len(bar) // 4


def test_format_seconds() -> None:
    assert [format_seconds(s) for s in (None, 0, 59.6, 3725)] == ["--:--", "00:00", "01:00", "1:02:05"]


def test_a_pipe_gets_phase_lines_and_throttled_progress_lines() -> None:
    out = io.StringIO()
    now = [0.0]
    view = ProgressView(out, interactive=False, width=60, clock=lambda: now[0], every_seconds=5)
    view.show(StreamEvent(1, "status", {"phase": "training", "message": "Training for 60 steps", "details": {"warnings": ["w1"]}}))
    for step in (1, 2, 3):
        now[0] += 1
        view.show(StreamEvent(step + 1, "progress", {**PROGRESS, "step": step}))
    now[0] += 10
    view.show(StreamEvent(9, "progress", {**PROGRESS, "step": 60, "progress_percent": 100.0}))
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["[training] Training for 60 steps", "  warning: w1"]
    assert [line.split("] ")[1].split()[0] for line in lines[2:]] == ["1/60", "60/60"]


def test_parse_sse_handles_ids_events_comments_and_multiline_data() -> None:
    text = ": ping\n\nid: 1\nevent: status\ndata: {\"a\":\ndata: 1}\n\nid: 2\nevent: progress\ndata: {}\n\n"
    assert list(parse_sse(iter(text.split("\n")))) == [("1", "status", '{"a":\n1}'), ("2", "progress", "{}")]
