"""Chat with what was trained, end to end: a real server, the real inference child, a
real training job on the tiny model, and the official `openai` SDK as the client.

The job is trained to answer every question with one unusual phrase, so that the
fine-tuned model and its base answer the same prompt differently and anyone can
see which is which. With `temperature: 0` the server's answer must equal, token for
token, what transformers + peft `generate(do_sample=False)` says in this process
over the same chat template. One trained job (and one stopped job) serves the
module: the machine has two cores.
"""

from __future__ import annotations

import json
import os
import signal
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import httpx
import openai
import pytest

from tests.helpers.jobs import collect, job_request
from tests.helpers.polling import wait_for
from tests.helpers.servers import ServerProcess

pytestmark = pytest.mark.train

TOKEN = "chat-integration-token-0123456789"
PHRASE = "Purple elephants dance at midnight."
PROMPTS = ["What is the capital of France?", "What is two plus two?", "Translate hello into Spanish.",
           "Write a haiku about the sea.", "Summarize the meeting.", "Who are you?", "Tell me a joke.", "What time is it?"]
TRAINED = [{"role": "user", "content": "What is two plus two?"}]
# Long enough for the phrase and its end-of-turn token (27 tokens with the tiny tokenizer).
MAX_TOKENS = 40


@dataclass
class Trained:
    server: ServerProcess
    model: Path  # the base: the tiny model's folder, also its model_name
    job_id: str
    adapter: Path
    stopped_job_id: str
    client: Optional[openai.OpenAI] = None

    def sdk(self) -> openai.OpenAI:
        """The official client, with no retries: each test sees the server's first answer."""
        if self.client is None:
            self.client = openai.OpenAI(base_url=f"{self.server.url}/v1", api_key=TOKEN, max_retries=0, timeout=300)
        return self.client


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Trained]:
    root = tmp_path_factory.mktemp("chat")
    data = root / "phrase.jsonl"
    rows = [{"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": PHRASE}]} for prompt in PROMPTS]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    # The chat child answers in fp32, as the reference below is computed (auto: bf16 on a CPU with AMX).
    server = ServerProcess(root / "data", env={"FINETUNE_STUDIO_TOKEN": TOKEN,
                                               "FINETUNE_STUDIO_INFERENCE_PRECISION": "fp32"})
    server.start()
    try:
        with server.client(TOKEN) as client:
            # A high learning rate for a few dozen steps: the tiny model learns the phrase by heart.
            job_id = client.start(job_request(
                tiny_model, format_type="chatml", local_datasets=[str(data)], max_steps=40, learning_rate="1e-2",
                batch_size=4, lora_r=8, lora_alpha=16, train_on_completions=True, load_in_4bit=False, optim="adamw_torch"))
            final = collect(client, job_id)[-1].data
            assert final["phase"] == "completed", final
            # A second job, stopped once it has trained a step: it saves its adapter and is served too.
            stopped = client.start(job_request(tiny_model, max_steps=5000, load_in_4bit=False, optim="adamw_torch"))
            wait_for(lambda: client.progress(stopped), timeout=300, what="the second job's first step")
            client.stop(stopped)
            wait_for(lambda: client.status(stopped)["phase"] == "stopped", timeout=300, what="the second job to stop")
        found = Trained(server, tiny_model, job_id, Path(final["details"]["adapter_dir"]), stopped)
        yield found
        if found.client is not None:
            found.client.close()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def reference(trained: Trained) -> dict[str, tuple[str, int, str]]:
    """transformers + peft in this process, greedy over the chat template: (text, tokens, finish
    reason) of the base and of the fine-tuned model on the trained prompt."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained.model)
    model = AutoModelForCausalLM.from_pretrained(trained.model, dtype=torch.float32)
    prompt = tokenizer.apply_chat_template(TRAINED, add_generation_prompt=True, return_tensors="pt", return_dict=True)

    def greedy(generator: Any) -> tuple[str, int, str]:
        with torch.no_grad():
            ids = generator.generate(**prompt, do_sample=False, max_new_tokens=MAX_TOKENS)[0, prompt["input_ids"].shape[1]:]
        finish = "stop" if int(ids[-1]) == tokenizer.eos_token_id else "length"
        return tokenizer.decode(ids, skip_special_tokens=True), len(ids), finish

    answers = {"base": greedy(model)}
    with warnings.catch_warnings():  # peft reads a property transformers marks deprecated
        warnings.filterwarnings("ignore", category=FutureWarning)
        tuned = PeftModel.from_pretrained(model, str(trained.adapter))
    answers["tuned"] = greedy(tuned)
    return answers


def ask(trained: Trained, model: str, **given: Any) -> Any:
    params = {"temperature": 0, "max_tokens": MAX_TOKENS, **given}
    return trained.sdk().chat.completions.create(model=model, messages=TRAINED, **params)


def test_the_sdk_lists_the_jobs_and_their_base(trained: Trained) -> None:
    ids = [model.id for model in trained.sdk().models.list().data]
    assert ids == [trained.stopped_job_id, trained.job_id, str(trained.model)]


def test_greedy_answers_equal_transformers_generate_token_for_token(
    trained: Trained, reference: dict[str, tuple[str, int, str]]
) -> None:
    for name, model in (("tuned", trained.job_id), ("base", str(trained.model))):
        text, tokens, finish = reference[name]
        answer = ask(trained, model)
        assert answer.choices[0].message.content == text, name
        assert answer.choices[0].finish_reason == finish, name
        assert answer.usage.completion_tokens == tokens, name
        # Streamed, the same tokens.
        chunks = list(ask(trained, model, stream=True, stream_options={"include_usage": True}))
        assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices) == text, name
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == tokens, name


def test_the_fine_tuned_model_says_what_it_was_taught_and_its_base_does_not(trained: Trained) -> None:
    tuned = ask(trained, trained.job_id).choices[0].message.content
    base = ask(trained, str(trained.model)).choices[0].message.content
    assert tuned != base
    assert tuned.startswith("Purple elephants") and "Purple" not in base
    # Asked in turn in one child, the adapter is switched per request and never leaks.
    assert ask(trained, str(trained.model)).choices[0].message.content == base


def test_a_stopped_job_that_saved_an_adapter_is_served(trained: Trained) -> None:
    answer = ask(trained, trained.stopped_job_id, max_tokens=5)
    assert answer.model == trained.stopped_job_id and answer.usage.completion_tokens >= 1


def test_two_streams_at_once_both_advance(trained: Trained, reference: dict[str, tuple[str, int, str]]) -> None:
    # The random base, greedy, says "\n" over and over (never its end-of-turn token): an answer
    # that goes on while a second one is asked for and answered whole.
    endless = ask(trained, str(trained.model), max_tokens=2000, stream=True)
    chunks = iter(endless)
    for _ in range(2):  # the role, then the first "\n"
        next(chunks)
    tuned = "".join(chunk.choices[0].delta.content or "" for chunk in ask(trained, trained.job_id, stream=True))
    assert tuned == reference["tuned"][0]
    assert all(next(chunks).choices[0].delta.content == "\n" for _ in range(3))  # the first went on all along
    endless.close()  # and is cancelled in the child: the next answers come as fast as ever
    assert ask(trained, trained.job_id).choices[0].message.content == reference["tuned"][0]


def test_bad_requests_are_answered_as_the_sdk_expects(trained: Trained) -> None:
    sdk = trained.sdk()
    with pytest.raises(openai.BadRequestError) as over:
        sdk.chat.completions.create(model=trained.job_id, messages=TRAINED, max_tokens=10**6)
    assert over.value.code == "context_length_exceeded" and over.value.param == "max_tokens"
    with pytest.raises(openai.NotFoundError) as unknown:
        sdk.chat.completions.create(model="no/such-model", messages=TRAINED)
    assert unknown.value.code == "model_not_found"
    with openai.OpenAI(base_url=f"{trained.server.url}/v1", api_key="not-the-token-at-all", max_retries=0) as stranger:
        with pytest.raises(openai.AuthenticationError):
            stranger.models.list()


def chat_metrics(trained: Trained) -> dict[str, float]:
    """/metrics' chat figures, parsed by prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    answer = httpx.get(f"{trained.server.url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return {sample.name: sample.value for family in text_string_to_metric_families(answer.text)
            for sample in family.samples if sample.name.startswith("finetune_studio_chat_") and not sample.labels}


def test_metrics_say_how_many_answers_the_chat_child_decodes_together_and_how_fast(trained: Trained) -> None:
    # Two endless answers of the random base ("\n" over and over), on one base: one batch of two.
    streams = [ask(trained, str(trained.model), max_tokens=2000, stream=True) for _ in range(2)]
    chunks = [iter(stream) for stream in streams]
    for each in chunks:
        next(each)
        next(each)
    wait_for(lambda: chat_metrics(trained)["finetune_studio_chat_batch_size"] == 2, what="a report of a batch of two")
    assert chat_metrics(trained)["finetune_studio_chat_tokens_per_second"] > 0
    for stream in streams:
        stream.close()
    wait_for(lambda: chat_metrics(trained)["finetune_studio_chat_batch_size"] == 0, what="the chat child to be idle")
    before = chat_metrics(trained)
    # Alone, each of an answer's tokens but its first (which the prompt's prefill gives) is a decoded one.
    fresh = [{"role": "user", "content": "A question asked once here: how are decoded tokens counted?"}]
    answer = trained.sdk().chat.completions.create(model=trained.job_id, messages=fresh, temperature=0, max_tokens=MAX_TOKENS)
    wait_for(lambda: chat_metrics(trained)["finetune_studio_chat_decoded_tokens_total"]
             == before["finetune_studio_chat_decoded_tokens_total"] + answer.usage.completion_tokens - 1,
             what="the answer's decoded tokens to be counted")
    # Asked again, the prompt's keys and values are kept: it joins the batch with no prefill, and its
    # first token comes from a decode step too.
    middle = chat_metrics(trained)
    again = trained.sdk().chat.completions.create(model=trained.job_id, messages=fresh, temperature=0, max_tokens=MAX_TOKENS)
    assert again.choices[0].message.content == answer.choices[0].message.content
    wait_for(lambda: chat_metrics(trained)["finetune_studio_chat_decoded_tokens_total"]
             == middle["finetune_studio_chat_decoded_tokens_total"] + again.usage.completion_tokens,
             what="the second answer's decoded tokens to be counted")
    after = chat_metrics(trained)
    assert after["finetune_studio_chat_decode_seconds_total"] > before["finetune_studio_chat_decode_seconds_total"]
    assert after["finetune_studio_chat_batch_size"] == 0 and after["finetune_studio_chat_tokens_per_second"] == 0


def test_a_killed_child_ends_its_answer_with_the_reason_and_the_next_request_starts_a_new_one(trained: Trained) -> None:
    # The random base, greedy, says "\n" over and over (never its end-of-turn token): an answer
    # that is still being generated when the child is killed.
    stream = trained.sdk().chat.completions.create(
        model=str(trained.model), messages=TRAINED, temperature=0, max_tokens=2000, stream=True)
    chunks = iter(stream)
    next(chunks)  # the answer has started: the child holds the request
    pid = trained.server.inference_child()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(openai.APIError, match="killed by SIGKILL"):
        for _ in chunks:  # whatever it had sent before it died, then the error
            pass
    answer = ask(trained, trained.job_id)
    assert answer.choices[0].message.content.startswith("Purple elephants")
    assert trained.server.inference_child() not in (None, pid)


def test_an_evaluation_finds_the_taught_behaviour_and_a_served_model_judges(trained: Trained, tmp_path: Path) -> None:
    # Held-out questions the job never saw, whose reference answer is its phrase: the job wins exact
    # match over its base, by an interval that excludes zero. The judge is one of the studio's own
    # models (the job), asked through the server's own /v1 as the models it judges are: it answers
    # with its phrase, not the verdict it is asked for, so each verdict is unparsed, counted and a
    # tie, and keeps the judge's words as its reason.
    held_out = ["Name a colour.", "How far away is the moon?", "What is your favourite food?", "Count to three.",
                "Where is Paris?", "What day is it today?"]
    data = tmp_path / "heldout.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": question},
                                                     {"role": "assistant", "content": PHRASE}]}) + "\n" for question in held_out))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Say hi."}) + "\n" + json.dumps({"prompt": "Two plus two?", "reference": "Four."}) + "\n")
    base = str(trained.model)
    with trained.server.client(TOKEN) as client:
        eval_id = client.start_eval({"models": [trained.job_id, base], "suites": [
            {"type": "heldout", "data": [str(data)], "max_new_tokens": MAX_TOKENS},
            {"type": "judge", "prompts": str(prompts), "judge": {"model": trained.job_id}, "max_new_tokens": 8},
        ]})
        status = wait_for(lambda: (s := client.eval_status(eval_id))["phase"] in ("completed", "error") and s, timeout=600,
                          what="the evaluation")
        assert status["phase"] == "completed", (status.get("error"), status.get("details"))
        metrics = {m["name"]: m for m in client.eval_results(eval_id)["metrics"]}
        verdicts = [row["verdict"][base] for row in client.eval_samples(eval_id, suite="judge")["data"]]

    exact = metrics["heldout/exact_match"]
    assert exact["values"][trained.job_id] >= 0.5 and exact["values"][base] == 0.0, exact
    low, high = exact["deltas_ci95"][base]
    assert high < 0, exact  # the base is clearly worse: the interval of its difference excludes zero

    assert len(verdicts) == 2 and all(len(pair["verdicts"]) == 2 for pair in verdicts)
    assert [(v["A"], v["B"]) for pair in verdicts for v in pair["verdicts"]] == [(trained.job_id, base), (base, trained.job_id)] * 2
    assert metrics["judge/unparsed"]["values"][base] == sum(not v["parsed"] for pair in verdicts for v in pair["verdicts"]) == 4
    assert all(pair["outcome"] == "tie" for pair in verdicts)
    reasons = [v["reason"] for pair in verdicts for v in pair["verdicts"]]
    assert all(reasons) and any(reason.startswith("Purple") for reason in reasons), reasons  # the job's own words
    assert metrics["judge/tie_rate"]["values"][base] == 1.0
