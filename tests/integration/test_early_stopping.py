"""Early stopping, end to end: a run trained on one answer and evaluated on the opposite
one sees its evaluation loss rise, stops well before max_steps, ends `completed` saying
so, and keeps its best checkpoint as the result. A patience without evaluations is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from finetune_studio.child.channel import JobFailure
from finetune_studio.wire import JobFolder
from tests.data.corpus import GOOD
from tests.helpers.jobs import collect, job_request
from tests.helpers.recipes import run_recipe
from tests.helpers.servers import ServerProcess

QUESTIONS = [f"What colour is box number {i}?" for i in range(16)]


def _alpaca(path: Path, answer: str) -> Path:
    path.write_text("".join(json.dumps({"instruction": q, "input": "", "output": answer}) + "\n" for q in QUESTIONS))
    return path


@pytest.mark.train
def test_a_rising_eval_loss_stops_the_run_early_and_keeps_the_best_checkpoint(
    server: ServerProcess, tiny_model: Path, tmp_path: Path
) -> None:
    # The training set says "red", the evaluation set "blue" to the same questions: the
    # more the model learns, the worse the evaluation loss gets.
    train = _alpaca(tmp_path / "train.jsonl", " ".join(["red"] * 30))
    held_out = _alpaca(tmp_path / "eval.jsonl", " ".join(["blue"] * 30))
    request = job_request(
        tiny_model, local_datasets=[str(train)], local_eval_datasets=[str(held_out)], learning_rate="1e-2",
        max_steps=30, eval_steps=0.05, early_stopping_patience=2,  # an evaluation every 2 steps
    )
    with server.client() as client:
        job_id = client.start(request)
        events = collect(client, job_id)

    final = events[-1].data
    assert final["phase"] == "completed", final
    details = final["details"]
    steps = [e.data for e in events if e.kind == "progress"]
    last = steps[-1]["step"]
    assert details.get("early_stopped") is True, (final["message"], [(p["step"], p.get("eval_loss")) for p in steps])
    assert details["steps"] == last < 30
    assert details["best_step"] < last
    evaluated = {p["step"]: p["eval_loss"] for p in steps if p.get("eval_loss") is not None}
    assert details["best_eval_loss"] == pytest.approx(min(evaluated.values()))
    assert evaluated[details["best_step"]] == pytest.approx(details["best_eval_loss"])
    assert f"stopped early at step {last}" in final["message"]
    assert f"best checkpoint, step {details['best_step']}" in final["message"]
    # The adapter saved as the result is the best checkpoint's.
    folder = JobFolder(Path(details["output_dir"]))
    best = folder.checkpoints / f"checkpoint-{details['best_step']}"
    assert (best / "adapter_model.safetensors").read_bytes() == (folder.adapter / "adapter_model.safetensors").read_bytes()


@pytest.mark.parametrize(
    ("fields", "named"),
    [({"eval_steps": 0.5}, "local_eval_datasets"), ({"local_eval_datasets": [str(GOOD / "chatml.jsonl")]}, "eval_steps")],
    ids=["no-eval-data", "no-eval-steps"],
)
def test_a_patience_without_evaluations_is_refused_before_the_model_loads(
    fields: dict[str, object], named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = {"format_type": "chatml", "early_stopping_patience": 2, **fields}
    statuses, ended = run_recipe(tmp_path, monkeypatch, GOOD / "chatml.jsonl", request)
    assert isinstance(ended, JobFailure), "the model loader was entered"
    assert ended.error_code == "config_invalid"
    assert "early_stopping_patience" in ended.message and named in ended.message
    assert [s["phase"] for s in statuses] == ["loading_model"]
