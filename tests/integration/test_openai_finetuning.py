"""OpenAI's fine-tuning API end to end, with the official `openai` SDK as the only client:
files, jobs (real training of the tiny model), events paged with the SDK's iterator,
checkpoints, cancel, pause and resume, errors, and chat with the fine-tuned model.

One server serves the module (the machine has two cores). Its jobs run the real
training child through tests/helpers/hooked_child.py, so that a test can hold a
job at a known step (for cancel and pause) instead of racing a 30 ms step.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from finetune_studio.config import Settings
from tests.helpers.hooked_child import HookedLauncher, Hooks
from tests.helpers.paths import REPO
from tests.helpers.polling import wait_for
from tests.helpers.servers import LiveServer

pytestmark = pytest.mark.train

TOKEN = "openai-finetuning-token-0123456789"
PHRASE = "Purple elephants dance at midnight."
PROMPTS = ["What is the capital of France?", "What is two plus two?", "Translate hello into Spanish.",
           "Write a haiku about the sea.", "Summarize the meeting.", "Who are you?", "Tell me a joke.", "What time is it?"]
JOB_TIMEOUT = 240.0


def chat_rows(prompts: list[str]) -> str:
    return "".join(
        json.dumps({"messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": prompt},
                                 {"role": "assistant", "content": PHRASE}]}) + "\n"
        for prompt in prompts
    )


class Studio:
    def __init__(self, server: LiveServer, launcher: HookedLauncher, model: Path) -> None:
        self.server = server
        self.launcher = launcher
        self.model = model
        self.sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0, timeout=120)

    def wait(self, job_id: str, *statuses: str) -> Any:
        return wait_for(
            lambda: (job := self.sdk.fine_tuning.jobs.retrieve(job_id)).status in statuses and job,
            timeout=JOB_TIMEOUT,
            interval=0.2,
            what=f"job {job_id} to be {' or '.join(statuses)}",
        )

    def upload(self, name: str, text: str) -> str:
        return self.sdk.files.create(file=(name, text.encode()), purpose="fine-tune").id


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Studio]:
    data_dir = tmp_path_factory.mktemp("openai-ft") / "data"
    launcher = HookedLauncher(Hooks())
    settings = Settings(data_dir=data_dir, token=TOKEN, stop_grace_seconds=30, kill_grace_seconds=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)  # the hooked child is imported from the repository
        with LiveServer(settings, launcher) as server:
            studio = Studio(server, launcher, tiny_model)
            with studio.sdk:  # its connections closed before the server stops
                yield studio


def test_upload_train_events_checkpoints_and_chat(studio: Studio) -> None:
    sdk = studio.sdk
    train = sdk.files.create(file=("train.jsonl", chat_rows(PROMPTS).encode()), purpose="fine-tune")
    assert (train.object, train.purpose, train.filename, train.status) == ("file", "fine-tune", "train.jsonl", "processed")
    assert train.bytes == len(chat_rows(PROMPTS).encode())
    assert sdk.files.retrieve(train.id).id == train.id
    assert sdk.files.content(train.id).read() == chat_rows(PROMPTS).encode()
    valid = studio.upload("valid.jsonl", chat_rows(PROMPTS[:4]))
    assert {train.id, valid} <= {f.id for f in sdk.files.list(purpose="fine-tune")}

    created = sdk.fine_tuning.jobs.create(
        model=str(studio.model),
        training_file=train.id,
        validation_file=valid,
        suffix="pirate",
        seed=7,
        metadata={"team": "tests"},
        method={"type": "supervised", "supervised": {"hyperparameters": {
            "n_epochs": 2, "batch_size": 2, "learning_rate_multiplier": 25}}},
    )
    assert created.status == "queued" and created.model == str(studio.model)
    assert (created.training_file, created.validation_file, created.seed) == (train.id, valid, 7)
    assert created.hyperparameters.n_epochs == 2 and created.metadata == {"team": "tests"}
    job = studio.wait(created.id, "succeeded", "failed", "cancelled")
    assert job.status == "succeeded", job.error
    assert job.fine_tuned_model == f"ft:{studio.model.name}:pirate:{job.id}"
    assert job.finished_at is not None and job.trained_tokens and job.trained_tokens > 0

    # Every event exactly once, newest first, through the SDK's own paging (3 a page).
    events = list(sdk.fine_tuning.jobs.list_events(job.id, limit=3))
    numbers = [int(event.id.rsplit("-", 1)[1]) for event in events]
    assert numbers == sorted(range(1, len(events) + 1), reverse=True)
    messages = [e.message for e in reversed(events) if e.type == "message"]
    assert messages[0].startswith("Job queued") and any(m.startswith("Job started") for m in messages)
    assert messages[-1].startswith("Job succeeded") and job.fine_tuned_model in messages[-1]
    metrics = [e.data for e in reversed(events) if e.type == "metrics"]
    assert [m["step"] for m in metrics] == list(range(1, 9))  # 8 rows / 2 a step, 2 epochs
    assert all(m["train_loss"] > 0 and 0 <= m["train_mean_token_accuracy"] <= 1 for m in metrics)
    evaluated = [m for m in metrics if "valid_loss" in m]
    assert [m["step"] for m in evaluated] == [4, 8]  # a validation loss at each epoch's end
    assert all(0 <= m["valid_mean_token_accuracy"] <= 1 for m in evaluated)

    checkpoints = list(sdk.fine_tuning.jobs.checkpoints.list(job.id, limit=1))
    assert [c.step_number for c in checkpoints] == [8, 4]
    assert [c.fine_tuned_model_checkpoint for c in checkpoints] == [f"{job.fine_tuned_model}:ckpt-step-{s}" for s in (8, 4)]
    assert checkpoints[0].metrics.train_loss == metrics[-1]["train_loss"]
    assert checkpoints[1].metrics.valid_loss == evaluated[0]["valid_loss"]

    assert job.fine_tuned_model in {model.id for model in sdk.models.list()}
    for model in (job.fine_tuned_model, checkpoints[1].fine_tuned_model_checkpoint):
        answer = sdk.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "What is two plus two?"}], temperature=0, max_tokens=40
        )
        assert answer.model == model and answer.choices[0].message.content
        assert answer.usage is not None and answer.usage.completion_tokens > 0


def test_cancel_a_running_job(studio: Studio) -> None:
    studio.launcher.hooks = Hooks(pause_at_step=1)  # held after its first step until the stop
    try:
        job = studio.sdk.fine_tuning.jobs.create(model=str(studio.model), training_file=studio.upload("c.jsonl", chat_rows(PROMPTS)))
        wait_for(lambda: any(e.type == "metrics" for e in studio.sdk.fine_tuning.jobs.list_events(job.id)),
                 timeout=JOB_TIMEOUT, what="a first step")
    finally:
        studio.launcher.hooks = Hooks()
    assert studio.sdk.fine_tuning.jobs.cancel(job.id).status in ("running", "cancelled")
    cancelled = studio.wait(job.id, "cancelled", "failed", "succeeded")
    assert cancelled.status == "cancelled" and cancelled.fine_tuned_model is None
    assert studio.sdk.fine_tuning.jobs.list_events(job.id, limit=1).data[0].message.startswith("Job cancelled")
    with pytest.raises(openai.ConflictError):
        studio.sdk.fine_tuning.jobs.resume(job.id)  # only a paused job resumes


def test_pause_then_resume_to_succeeded(studio: Studio) -> None:
    sdk = studio.sdk
    studio.launcher.hooks = Hooks(pause_at_step=2)  # so the pause ends step 3, mid-epoch
    try:
        job = sdk.fine_tuning.jobs.create(
            model=str(studio.model), training_file=studio.upload("p.jsonl", chat_rows(PROMPTS)),
            hyperparameters={"n_epochs": 2, "batch_size": 2},
        )
        wait_for(lambda: sum(e.type == "metrics" for e in sdk.fine_tuning.jobs.list_events(job.id)) >= 2,
                 timeout=JOB_TIMEOUT, what="two steps")
    finally:
        studio.launcher.hooks = Hooks()  # the resumed run goes through
    sdk.fine_tuning.jobs.pause(job.id)
    paused = studio.wait(job.id, "paused", "failed", "succeeded", "cancelled")
    assert paused.status == "paused" and paused.fine_tuned_model is None
    before = list(sdk.fine_tuning.jobs.list_events(job.id, limit=100))
    assert before[0].message.startswith("Job paused")
    paused_steps = [e.data["step"] for e in before if e.type == "metrics"]
    # The pause's checkpoint (mid-epoch) is listed: it is a chat model like the epochs' ones.
    paused_checkpoints = sdk.fine_tuning.jobs.checkpoints.list(job.id).data
    assert [c.step_number for c in paused_checkpoints] == [3]
    assert paused_checkpoints[0].fine_tuned_model_checkpoint.endswith(f":{job.id}:ckpt-step-3")

    assert sdk.fine_tuning.jobs.resume(job.id).status == "queued"
    done = studio.wait(job.id, "succeeded", "failed", "cancelled")
    assert done.status == "succeeded", [e.message for e in sdk.fine_tuning.jobs.list_events(job.id, limit=100)]
    after = list(sdk.fine_tuning.jobs.list_events(job.id, limit=7))
    numbers = [int(e.id.rsplit("-", 1)[1]) for e in after]
    assert numbers == sorted(range(1, len(after) + 1), reverse=True)  # the ids went on, each event once
    assert {e.id for e in before} < {e.id for e in after}
    steps = [e.data["step"] for e in reversed(after) if e.type == "metrics"]
    assert steps == list(range(1, 9)) and max(paused_steps) == 3  # continued after the pause, no step twice
    assert any(e.message.startswith("Resumed") for e in after)
    assert [c.step_number for c in sdk.fine_tuning.jobs.checkpoints.list(job.id)] == [8, 4, 3]


def preference_rows(prompts: list[str]) -> str:
    """OpenAI's preference format: the phrase preferred over a refusal."""
    return "".join(
        json.dumps({"input": {"messages": [{"role": "user", "content": prompt}]},
                    "preferred_output": [{"role": "assistant", "content": PHRASE}],
                    "non_preferred_output": [{"role": "assistant", "content": "I cannot say."}]}) + "\n"
        for prompt in prompts
    )


def test_dpo_from_a_preference_file(studio: Studio) -> None:
    """method.type dpo trains with the studio's DPO (training_method "dpo"); its metrics events
    carry DPO's figures beside the loss, and a chat file for a dpo job is refused."""
    sdk = studio.sdk
    pairs = studio.upload("pairs.jsonl", preference_rows(PROMPTS[:4]))
    with pytest.raises(openai.BadRequestError, match="preference") as refused:
        sdk.fine_tuning.jobs.create(model=str(studio.model), training_file=studio.upload("chat.jsonl", chat_rows(PROMPTS[:2])),
                                    method={"type": "dpo"})
    assert refused.value.param == "training_file"
    created = sdk.fine_tuning.jobs.create(
        model=str(studio.model), training_file=pairs,
        method={"type": "dpo", "dpo": {"hyperparameters": {"n_epochs": 1, "batch_size": 2, "beta": 0.2}}},
    )
    assert created.method is not None and created.method.type == "dpo"
    job = studio.wait(created.id, "succeeded", "failed", "cancelled")
    assert job.status == "succeeded", job.error
    with studio.server.client(TOKEN) as client:
        status = client.status(job.id)
    assert status["phase"] == "completed" and status["details"]["reference_model"], status["details"]
    metrics = [e.data for e in sdk.fine_tuning.jobs.list_events(job.id) if e.type == "metrics"]
    assert sorted(m["step"] for m in metrics) == [1, 2]  # 4 pairs, 2 a step, 1 epoch
    assert all("rewards/margins" in m and "rewards/accuracies" in m for m in metrics), metrics


def test_list_pages_through_every_job_one_at_a_time(studio: Studio) -> None:
    listed = [job.id for job in studio.sdk.fine_tuning.jobs.list(limit=1)]
    assert len(listed) == len(set(listed)) >= 3
    assert listed == [job.id for job in studio.sdk.fine_tuning.jobs.list(limit=100).data]


def test_a_bad_file_is_refused_naming_its_line(studio: Studio) -> None:
    bad = chat_rows(PROMPTS[:2]) + '{"messages": [{"role": "bot", "content": "hi"}]}\n' + "not json\n"
    with pytest.raises(openai.BadRequestError) as refused:
        studio.sdk.files.create(file=("bad.jsonl", bad.encode()), purpose="fine-tune")
    text = str(refused.value)
    assert re.search(r"line 3 messages\[0\]\.role is \"bot\"", text) and "line 4 is not valid JSON" in text
    assert refused.value.param == "file"


def test_a_wrong_key_is_refused(studio: Studio) -> None:
    with openai.OpenAI(base_url=f"{studio.server.url}/v1", api_key="not-the-token-0123456789", max_retries=0) as wrong:
        with pytest.raises(openai.AuthenticationError):
            wrong.fine_tuning.jobs.list()
        with pytest.raises(openai.AuthenticationError):
            wrong.files.create(file=("a.jsonl", chat_rows(PROMPTS[:1]).encode()), purpose="fine-tune")
