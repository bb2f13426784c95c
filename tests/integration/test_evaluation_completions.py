"""Evaluations through the server's real `POST /v1/completions` (the chat child's own
log-probabilities): heldout's loss, perplexity and token accuracy equal transformers' own on
the same tokens, and an lm_eval task runs against it. Each test probes the route first and is
skipped, saying so, where this server does not have it yet.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
import pytest

from finetune_studio.child.completions import assistant_spans
from finetune_studio.config import Settings
from tests.helpers.evaluations import TASK_YAML, AdapterLauncher, rows_file, trained
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for
from tests.helpers.servers import LiveServer

pytestmark = pytest.mark.train

ROUTE_MISSING = (
    "POST /v1/completions is missing on this server: heldout's loss, perplexity and token accuracy and every lm_eval"
    " suite need it (echo, logprobs); the evaluation leaves them out (heldout) or fails saying so (lm_eval)"
)


def completions_route(url: str) -> bool:
    answer = httpx.post(f"{url}/v1/completions", json={"model": "none", "prompt": "a", "max_tokens": 1}, timeout=30)
    return answer.status_code != 404 or (answer.json().get("error") or {}).get("code") == "model_not_found"


def serve(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> LiveServer:
    monkeypatch.chdir(REPO)
    server = LiveServer(Settings(data_dir=tmp_path / "data", stop_grace_seconds=20), AdapterLauncher(tiny_model))
    server.settings.port = server.port
    return server


def by_hand_loss(tiny_model: Path, rows: list[dict[str, Any]]) -> tuple[float, float]:
    """(loss, token accuracy) of the tiny model over the rows' answer tokens, with transformers itself."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model)).eval()
    nll, tokens, correct = 0.0, 0, 0
    for row in rows:
        text, spans = assistant_spans(tokenizer, row["messages"])
        encoded = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        ids = torch.tensor([encoded["input_ids"]])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
        for position in range(1, ids.shape[1]):
            start, end = encoded["offset_mapping"][position]
            if end > start and any(a <= start and end <= b for a, b in spans):
                token = int(ids[0, position])
                nll -= float(logprobs[position - 1, token])
                tokens += 1
                correct += int(int(logprobs[position - 1].argmax()) == token)
    return nll / tokens, correct / tokens


def test_heldout_loss_through_the_servers_completions(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with serve(tmp_path, tiny_model, monkeypatch) as server, server.client() as client:
        if not completions_route(server.url):
            pytest.skip(ROUTE_MISSING)
        job_id = trained(client, rows_file(tmp_path / "train.jsonl", ["hi"]))
        users = ["What is the capital of France?", "Two plus two?"]
        data = rows_file(tmp_path / "heldout.jsonl", users)
        rows = [json.loads(line) for line in data.read_text().splitlines()]
        eval_id = client.start_eval({"models": [f"base:{job_id}"], "suites": [{"type": "heldout", "data": [str(data)], "max_new_tokens": 8}]})
        status = wait_for(lambda: (s := client.eval_status(eval_id))["phase"] in ("completed", "error") and s, timeout=600, what="the evaluation")
        assert status["phase"] == "completed", status
        metrics = {m["name"]: m for m in client.eval_results(eval_id)["metrics"]}
    loss, accuracy = by_hand_loss(tiny_model, rows)
    model = f"base:{job_id}"
    assert metrics["heldout/loss"]["values"][model] == pytest.approx(loss, rel=1e-3)
    assert metrics["heldout/perplexity"]["values"][model] == pytest.approx(math.exp(loss), rel=1e-3)
    assert metrics["heldout/token_accuracy"]["values"][model] == pytest.approx(accuracy, abs=1e-6)


def test_an_lm_eval_task_runs_against_the_servers_completions(tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    data = tasks / "tiny_mc.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i}+{i}?", "choices": [str(2 * i), "no"], "answer": 0}) + "\n" for i in range(4)))
    (tasks / "tiny_mc.yaml").write_text(TASK_YAML.format(data=data))
    with serve(tmp_path, tiny_model, monkeypatch) as server, server.client() as client:
        if not completions_route(server.url):
            pytest.skip(ROUTE_MISSING)
        job_id = trained(client, rows_file(tmp_path / "train.jsonl", ["hi"]))
        suites = [{"type": "lm_eval", "tasks": ["tiny_mc"], "tasks_dir": str(tasks)}]
        eval_id = client.start_eval({"models": [f"base:{job_id}"], "suites": suites})
        status = wait_for(lambda: (s := client.eval_status(eval_id))["phase"] in ("completed", "error") and s, timeout=900, what="the evaluation")
        assert status["phase"] == "completed", status
        metric = next(m for m in client.eval_results(eval_id)["metrics"] if m["name"] == "lm_eval/tiny_mc/acc")
        assert 0.0 <= metric["values"][f"base:{job_id}"] <= 1.0 and metric["samples"] == 4
