"""The CLI without a server: flags to request, the views' exact text, Ctrl-C while following, the SSE parser."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Optional, cast, get_args

import pytest
from rich.console import Console

from finetune_studio.cli.client import StreamEvent, StudioError, error_text, parse_sse
from finetune_studio.cli.follow import Answer, Outcome, ask_on_terminal, follow
from finetune_studio.cli.jobs import job_rows, print_jobs, status_lines
from finetune_studio.cli.main import FORMAT_TYPES, TRAINING_TYPES, build_parser
from finetune_studio.cli.progress import JsonLinesView, LinesView, LiveView, format_seconds, method_text, progress_line
from finetune_studio.cli.train import CPU_SETTINGS, build_request, may_start_server, runs_on_cpu
from finetune_studio.schemas import FormatType, TrainingType

PROGRESS = {"step": 15, "total_steps": 60, "loss": 2.3125, "learning_rate": 2e-4, "progress_percent": 25.0,
            "elapsed_seconds": 25.2, "eta_seconds": 75.4}


def plain_console(width: int = 60) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=width, force_terminal=False, color_system=None), out


def status(phase: str, message: str, error: Optional[str] = None, **details: Any) -> StreamEvent:
    return StreamEvent(0, "status", {"job_id": "j1", "phase": phase, "message": message, "error": error, "details": details})


def progress(step: int, total: int = 60, **fields: Any) -> StreamEvent:
    return StreamEvent(0, "progress", {**PROGRESS, "step": step, "total_steps": total, "progress_percent": 100 * step / total, **fields})


# -- flags to request ---------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["train", *argv])


def test_flags_map_to_the_request_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    args = parse(
        "--model", "model", "--data", "a.jsonl", "--data", str(tmp_path / "b.csv"), "--format", "alpaca",
        "--max-steps", "5", "--epochs", "2", "--lr", "2e-3", "--batch-size", "4", "--lora-r", "8", "--max-seq-length", "256",
    )
    assert build_request(args, cpu=False) == {
        "model_name": str(tmp_path / "model"),  # a local folder is sent as an absolute path
        "training_type": "LoRA/QLoRA",
        "format_type": "alpaca",
        "local_datasets": [str(tmp_path / "a.jsonl"), str(tmp_path / "b.csv")],
        "max_steps": 5,
        "num_epochs": 2,
        "learning_rate": 2e-3,
        "batch_size": 4,
        "lora_r": 8,
        "max_seq_length": 256,
    }


def test_only_given_flags_are_sent_and_cpu_adds_what_works_without_cuda(tmp_path: Path) -> None:
    args = parse("--model", "HuggingFaceTB/SmolLM2-135M", "--data", str(tmp_path / "d.jsonl"), "--training-type", "Full Finetuning")
    assert build_request(args, cpu=True) == {
        "model_name": "HuggingFaceTB/SmolLM2-135M",  # not a path here: a hub id, as given
        "training_type": "Full Finetuning",
        "format_type": "auto",
        "local_datasets": [str(tmp_path / "d.jsonl")],
        "load_in_4bit": False,
        "optim": "adamw_torch",
    }
    assert CPU_SETTINGS == {"load_in_4bit": False, "optim": "adamw_torch"}


def test_set_parses_json_values_and_wins_over_the_flags(tmp_path: Path) -> None:
    args = parse(
        "--model", "m", "--data", str(tmp_path / "d.jsonl"), "--lora-r", "8",
        "--set", "lora_r=32", "--set", "packing=true", "--set", 'target_modules=["q_proj", "v_proj"]',
        "--set", "project_name=demo run", "--set", "optim=adamw_8bit", "--set", "learning_rate=1e-4",
    )
    request = build_request(args, cpu=True)
    assert request["lora_r"] == 32
    assert request["packing"] is True
    assert request["target_modules"] == ["q_proj", "v_proj"]
    assert request["project_name"] == "demo run"  # not JSON: kept as a string
    assert request["optim"] == "adamw_8bit"  # --set overrides the CPU defaults too
    assert request["learning_rate"] == 1e-4


@pytest.mark.parametrize("bad", ["lora_r", "=3", "lora r=3"])
def test_a_malformed_set_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse("--model", "m", "--data", "d", "--set", bad)
    assert exit_info.value.code == 2
    assert "expected key=value" in capsys.readouterr().err


def test_the_parser_knows_every_training_type_and_format() -> None:
    assert TRAINING_TYPES == get_args(TrainingType)
    assert FORMAT_TYPES == get_args(FormatType)


def test_the_server_is_started_only_at_a_loopback_http_address_with_a_port() -> None:
    assert may_start_server("http://127.0.0.1:8000")
    assert may_start_server("http://localhost:9001/")
    assert not may_start_server("http://127.0.0.1")  # no port: not one a server here would take
    assert not may_start_server("https://127.0.0.1:8000")
    assert not may_start_server("http://10.0.0.5:8000")
    assert not may_start_server("http://127.0.0.1:8000/studio")
    assert not may_start_server("http://127.0.0.1:port")


def test_device_auto_guesses_cpu_only_for_a_server_on_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("finetune_studio.cli.train.has_nvidia_gpu", lambda: False)
    assert runs_on_cpu("auto", "http://127.0.0.1:8000")
    assert not runs_on_cpu("auto", "http://gpu-box:8000")  # unknown: the server falls back and says so
    assert runs_on_cpu("cpu", "http://gpu-box:8000")
    monkeypatch.setattr("finetune_studio.cli.train.has_nvidia_gpu", lambda: True)
    assert not runs_on_cpu("auto", "http://127.0.0.1:8000")
    assert not runs_on_cpu("cuda", "http://127.0.0.1:8000")


def test_building_the_parser_imports_neither_rich_nor_httpx() -> None:
    # `serve` shares the parser and must start fast: the client's libraries load only in its commands.
    check = (
        "import sys; from finetune_studio.cli.main import build_parser; build_parser().parse_args(['jobs']);"
        " print(sorted(name for name in ('rich', 'httpx', 'pydantic') if name in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True).stdout.strip() == "[]"


# -- the views ---------------------------------------------------------------


def test_format_seconds() -> None:
    assert [format_seconds(s) for s in (None, 0, 59.6, 3725)] == ["--:--", "00:00", "01:00", "1:02:05"]


def test_progress_line() -> None:
    assert progress_line(PROGRESS) == "step 15/60   25.0%  loss 2.3125  lr 2.00e-04  eta 01:15"
    diverged = {**PROGRESS, "loss": None, "loss_finite": False}
    assert progress_line(diverged) == "step 15/60   25.0%  loss not finite  lr 2.00e-04  eta 01:15"
    assert progress_line({**PROGRESS, "eval_loss": 2.5, "eta_seconds": None}).endswith("eta --:--  eval_loss 2.5000")
    assert progress_line({**PROGRESS, "tokens_per_second": 1234.6}).endswith("eta 01:15  1,235 tok/s")


# A DPO step as the child sends it (TRL 1.16's DPOTrainer logs, by ProgressCallback),
# and a GRPO one: what `metrics` carries beside the loss.
DPO_STEP = {
    "step": 3, "total_steps": 12, "loss": 0.6931, "learning_rate": 5e-5, "progress_percent": 25.0, "epoch": 0.5,
    "elapsed_seconds": 4.1, "eta_seconds": 12.3, "grad_norm": 1.92, "num_tokens": 384,
    "metrics": {
        "entropy": 10.37, "logits/chosen": -0.0123, "logits/rejected": -0.0131, "rewards/chosen": 0.00612,
        "rewards/rejected": -0.00615, "rewards/accuracies": 0.75, "rewards/margins": 0.01227,
        "logps/chosen": -48.71, "logps/rejected": -52.06,
    },
}
GRPO_METRICS = {"reward": 0.625, "reward_std": 0.4841, "rewards/regex/mean": 0.625, "completions/mean_length": 3.5, "kl": 0.0}


def test_a_methods_figures_follow_the_loss_and_an_sft_line_is_unchanged() -> None:
    assert progress_line(DPO_STEP) == "step 3/12   25.0%  loss 0.6931  margin 0.0123  acc 0.75  lr 5.00e-05  eta 00:12"
    assert method_text({**DPO_STEP, "metrics": GRPO_METRICS}) == "reward 0.625  std 0.484"
    # KTO: a batch without both kinds of answer logs no margin; orpo's log odds are not shown.
    assert method_text({"metrics": {"rewards/chosen": 1.5, "kl": 0.02}}) == "chosen 1.5  kl 0.02"
    assert method_text({"metrics": {"rewards/margins": 2.0, "log_odds_ratio": -0.6}}) == "margin 2"
    sft = {key: value for key, value in DPO_STEP.items() if key != "metrics"}
    assert progress_line(sft) == "step 3/12   25.0%  loss 0.6931  lr 5.00e-05  eta 00:12"
    assert progress_line({**sft, "metrics": None}) == progress_line({**sft, "metrics": {}}) == progress_line(sft)


def test_the_live_bar_shows_a_methods_figures_after_the_loss() -> None:
    out = io.StringIO()
    console = Console(file=out, width=140, force_terminal=True, color_system=None)
    view = LiveView(console, clock=lambda: 0.0)
    view.show(StreamEvent(1, "progress", DPO_STEP))
    view.close()
    frames = [frame for frame in out.getvalue().replace("\r", "\n").split("\n") if "training " in frame]
    assert frames[-1].endswith("3/12  25% loss 0.6931  margin 0.0123  acc 0.75  lr 5.00e-05  00:04 elapsed, eta 00:12")


def test_a_pipe_gets_phase_lines_and_throttled_progress_lines() -> None:
    console, out = plain_console(width=40)  # narrower than the lines: they must not wrap
    now = [0.0]
    view = LinesView(console, clock=lambda: now[0], every_seconds=5)
    view.show(status("loading_model", "Loading model [tiny]"))
    view.show(status("training", "Training for 60 steps", warnings=["w1"]))
    for step in (1, 2, 3):  # the first is shown, the next two fall within 5 s of it
        now[0] += 1
        view.show(progress(step))
    now[0] += 10
    view.show(progress(4))
    now[0] += 1
    view.show(progress(60))  # the last step is always shown
    view.show(status("completed", "Training completed: 60 steps", warnings=["w1"]))
    view.close()
    assert out.getvalue().splitlines() == [
        "[loading_model] Loading model [tiny]",
        "[training] Training for 60 steps",
        "  warning: w1",
        "step 1/60    1.7%  loss 2.3125  lr 2.00e-04  eta 01:15",
        "step 4/60    6.7%  loss 2.3125  lr 2.00e-04  eta 01:15",
        "step 60/60  100.0%  loss 2.3125  lr 2.00e-04  eta 01:15",
        "[completed] Training completed: 60 steps",
    ]


def test_an_error_is_shown_with_its_error_code() -> None:
    console, out = plain_console()
    LinesView(console, clock=lambda: 0.0).show(status("error", "Training failed", "d.jsonl, line 3: not JSON", error_code="dataset_invalid"))
    assert out.getvalue() == "[error] Training failed\n  error (dataset_invalid): d.jsonl, line 3: not JSON\n"


def test_a_terminal_gets_a_live_bar_below_the_phase_lines() -> None:
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=True, color_system=None)
    view = LiveView(console, clock=lambda: 0.0)
    view.show(status("training", "Training for 4 steps"))
    for step in (1, 2):
        view.show(progress(step, 4, elapsed_seconds=step, eta_seconds=3))
    with view.paused():
        console.file.write("Stop job j1? [y/N] n\n")
    for step in (3, 4):
        view.show(progress(step, 4, elapsed_seconds=step, eta_seconds=0))
    view.show(status("completed", "Training completed: 4 steps"))
    text = out.getvalue()
    assert text.startswith("[training] Training for 4 steps\n")
    assert text.endswith("[completed] Training completed: 4 steps\n")
    frames = [frame for frame in text.replace("\r", "\n").split("\n") if "training " in frame]
    assert "2/4  50% loss 2.3125  lr 2.00e-04  00:02 elapsed, eta 00:03" in frames[1]
    assert frames[-1].endswith("4/4 100% loss 2.3125  lr 2.00e-04  00:04 elapsed, eta 00:00")
    assert "━" * 20 in frames[-1]
    # The bar was taken down for the question and drawn again below it.
    assert text.index("Stop job j1?") < text.index("3/4")
    assert text.index("Stop job j1?") > text.index("2/4")


def test_json_lines_are_the_events_as_they_came() -> None:
    out = io.StringIO()
    view = JsonLinesView(out)
    view.show(StreamEvent(7, "progress", PROGRESS))
    view.write(Outcome("j1", {"phase": "completed", "message": "done", "details": {"steps": 60, "adapter_dir": "/a"}}, PROGRESS).summary())
    first, last = (json.loads(line) for line in out.getvalue().splitlines())
    assert first == {"event": "progress", "id": 7, "data": PROGRESS}
    assert last == {
        "event": "summary", "job_id": "j1", "phase": "completed", "left_running": False, "message": "done",
        "error": None, "error_code": None, "steps": 60, "total_steps": 60, "loss": 2.3125, "train_loss": None,
        "saved_to": "/a", "exit_code": 0,
    }


# -- export's flags ------------------------------------------------------------


def export_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["export", *argv])


def test_lora_gguf_takes_an_optional_type_after_the_job_id() -> None:
    assert (export_args("j1", "--lora-gguf").job_id, export_args("j1", "--lora-gguf").lora_gguf) == ("j1", "f16")
    assert export_args("j1", "--lora-gguf", "Q8_0").lora_gguf == "q8_0"
    assert export_args("--lora-gguf=bf16", "j1").lora_gguf == "bf16"
    assert vars(export_args("--lora-gguf", "q8_0", "j1")) == vars(export_args("j1", "--lora-gguf", "q8_0"))
    assert export_args("j1", "--lora-gguf", "--out", "d").lora_gguf == "f16"
    assert export_args("j1", "--gguf", "q4_k_m").lora_gguf is None


@pytest.mark.parametrize("argv", [("--lora-gguf", "3f2a9c01"), ("--lora-gguf", "3f2a9c01", "--out", "d")])
def test_a_job_id_right_after_lora_gguf_says_how_to_write_it(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        export_args(*argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "'3f2a9c01' is not a LoRA GGUF type (f16, bf16, q8_0)" in err
    assert "put the job id first (finetune-studio export 3f2a9c01 --lora-gguf), or write the type as --lora-gguf=TYPE" in err


# -- following, and Ctrl-C ----------------------------------------------------


class FakeClient:
    """Serves a scripted job: a KeyboardInterrupt where the script says, and stop() ends it `stopped`."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events
        self.cursors: list[int] = []
        self.stopped = False

    def stream(self, job_id: str, last_event_id: int = 0) -> Iterator[StreamEvent]:
        self.cursors.append(last_event_id)
        for item in self.events:
            if isinstance(item, StreamEvent) and item.id <= last_event_id:
                continue
            if item is KeyboardInterrupt:
                self.events.remove(item)  # once
                raise KeyboardInterrupt
            if item == "stop-point" and self.stopped:
                yield StreamEvent(99, "status", {"job_id": job_id, "phase": "stopped", "message": "Stopped at step 2", "error": None})
                return
            if isinstance(item, StreamEvent):
                yield item

    def stop(self, job_id: str) -> dict[str, Any]:
        self.stopped = True
        return {"job_id": job_id, "phase": "training", "message": "Stop requested"}


def scripted_job() -> list[Any]:
    return [
        StreamEvent(1, "status", {"phase": "training", "message": "Training for 3 steps", "error": None}),
        StreamEvent(2, "progress", {**PROGRESS, "step": 1, "total_steps": 3}),
        KeyboardInterrupt,
        StreamEvent(3, "progress", {**PROGRESS, "step": 2, "total_steps": 3}),
        "stop-point",
        StreamEvent(4, "progress", {**PROGRESS, "step": 3, "total_steps": 3}),
        StreamEvent(5, "status", {"phase": "completed", "message": "done", "error": None}),
    ]


def run_follow(answer: Answer) -> tuple[Outcome, FakeClient, list[str], list[str]]:
    client = FakeClient(scripted_job())
    console, out = plain_console(width=100)
    questions: list[str] = []
    notes: list[str] = []

    def ask(question: str) -> Answer:
        questions.append(question)
        return answer

    outcome = follow(client, "j1", LinesView(console, clock=lambda: 0.0, every_seconds=0), ask, notes.append)  # type: ignore[arg-type]
    assert questions == ["Stop job j1? [y/N] "]
    return outcome, client, out.getvalue().splitlines(), notes


def test_ctrl_c_then_yes_stops_the_job_and_follows_it_to_stopped() -> None:
    outcome, client, lines, notes = run_follow("stop")
    assert client.stopped and client.cursors == [0, 2]  # resumed after the last event shown
    assert outcome.phase == "stopped" and outcome.exit_code == 1
    assert notes == ["asked job j1 to stop: Stop requested"]
    assert [line.split()[0] for line in lines] == ["[training]", "step", "step", "[stopped]"]


def test_ctrl_c_then_no_keeps_following_to_the_end() -> None:
    outcome, client, lines, notes = run_follow("follow")
    assert not client.stopped and outcome.phase == "completed" and outcome.exit_code == 0
    assert [line.split(" ")[1] for line in lines if line.startswith("step")] == ["1/3", "2/3", "3/3"]  # none lost or repeated
    assert notes == []


def test_ctrl_c_then_leave_returns_with_the_job_running() -> None:
    outcome, client, _, notes = run_follow("leave")
    assert not client.stopped and outcome.left_running and outcome.exit_code == 130
    assert notes == ["left job j1 running; `finetune-studio stop j1` stops it"]


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("reply", "answer"), [("y\n", "stop"), ("YES\n", "stop"), ("\n", "follow"), ("n\n", "follow"), ("", "follow")])
def test_the_question_on_a_terminal(reply: str, answer: Answer) -> None:
    out = io.StringIO()
    assert ask_on_terminal("Stop job j1? [y/N] ", FakeTerminal(reply), out) == answer
    assert out.getvalue().startswith("Stop job j1? [y/N] ")


class InterruptedTerminal:
    """A terminal where the user presses Ctrl-C again instead of answering."""

    def isatty(self) -> bool:
        return True

    def readline(self) -> str:
        raise KeyboardInterrupt


def test_a_second_ctrl_c_at_the_question_leaves_the_job_running() -> None:
    assert ask_on_terminal("Stop job j1? [y/N] ", cast(IO[str], InterruptedTerminal()), io.StringIO()) == "leave"


def test_without_a_terminal_ctrl_c_leaves_the_job_running_and_says_why() -> None:
    out = io.StringIO()
    assert ask_on_terminal("Stop job j1? [y/N] ", io.StringIO("y\n"), out) == "leave"
    assert "stdin is not a terminal" in out.getvalue()


# -- jobs and status ----------------------------------------------------------


class ListClient:
    def __init__(self) -> None:
        self.asked: list[str] = []

    def progress(self, job_id: str) -> dict[str, Any]:
        self.asked.append(job_id)
        return {**PROGRESS, "step": 16, "total_steps": 200}


JOBS = [
    {"job_id": "a1", "phase": "training", "message": "Training for 200 steps", "details": {"model_name": "/m/tiny"}},
    {"job_id": "b2", "phase": "stopped", "message": "Stopped at step 16", "details": {"model_name": "/m/tiny", "steps": 16, "adapter_dir": "/d/b2/adapter"}},
    {"job_id": "c3", "phase": "idle", "message": "Queued (position 1)", "details": {}},
]


def test_jobs_without_a_terminal_are_tab_separated_lines() -> None:
    client = ListClient()
    console, out = plain_console(width=30)
    print_jobs(console, job_rows(client, JOBS))  # type: ignore[arg-type]
    assert client.asked == ["a1", "b2"]  # a queued job has no step to ask for
    assert out.getvalue().splitlines() == [
        "id\tphase\tmodel\tstep\tmessage",
        "a1\ttraining\t/m/tiny\t16/200\tTraining for 200 steps",
        "b2\tstopped\t/m/tiny\t16/200\tStopped at step 16",
        "c3\tidle\t-\t-\tQueued (position 1)",
    ]


def test_jobs_on_a_terminal_are_a_table() -> None:
    out = io.StringIO()
    print_jobs(Console(file=out, width=100, force_terminal=True, color_system=None), job_rows(ListClient(), JOBS))  # type: ignore[arg-type]
    text = out.getvalue()
    assert "┃ id" in text and "16/200" in text and "Queued (position 1)" in text


def test_status_lines() -> None:
    assert status_lines(JOBS[1], None) == ["job b2", "  [stopped] Stopped at step 16", "  model: /m/tiny", "  saved in: /d/b2/adapter"]
    assert status_lines(JOBS[0], {**PROGRESS, "step": 16, "total_steps": 200, "progress_percent": 8.0})[-1] == (
        "  step 16/200    8.0%  loss 2.3125  lr 2.00e-04  eta 01:15"
    )


# -- the client ---------------------------------------------------------------


def test_error_text_reads_refusals_and_schema_errors() -> None:
    assert error_text({"status": "error", "error": "dataset file not found: x"}) == "dataset file not found: x"
    assert error_text({"detail": [{"loc": ["body", "max_steps"], "msg": "Input should be >= 0"},
                                  {"loc": ["body"], "msg": "no training data"}]}) == "max_steps: Input should be >= 0; no training data"
    assert error_text({"detail": "no job with id 'x'"}) == "no job with id 'x'"
    assert error_text([1]) is None


def test_a_studio_error_keeps_the_status_code() -> None:
    assert StudioError("404: no job", 404).status_code == 404
    assert StudioError("cannot reach").status_code is None


def test_parse_sse_handles_ids_events_comments_and_multiline_data() -> None:
    text = ": ping\n\nid: 1\nevent: status\ndata: {\"a\":\ndata: 1}\n\nid: 2\nevent: progress\ndata: {}\n\n"
    assert list(parse_sse(iter(text.split("\n")))) == [("1", "status", '{"a":\n1}'), ("2", "progress", "{}")]


def test_an_evaluations_live_bar_counts_samples_over_suites_and_models() -> None:
    from finetune_studio.cli.eval_job import EvalLiveView

    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True, color_system=None)
    view = EvalLiveView(console, clock=lambda: 0.0)
    for done, suite, model in ((3, "heldout", "base:j1"), (12, "heldout", "j1"), (40, "judge", "j1")):
        view.show(StreamEvent(done, "progress", {"step": done, "total_steps": 40, "progress_percent": done / 0.4,
                                                 "suite": suite, "model": model, "eta_seconds": 40 - done}))
    view.close()
    frames = [frame for frame in out.getvalue().replace("\r", "\n").split("\n") if "evaluating " in frame]
    assert "12/40  30% heldout · j1  eta 00:28" in frames[1]
    assert frames[-1].endswith("40/40 100% judge · j1  eta 00:00")
