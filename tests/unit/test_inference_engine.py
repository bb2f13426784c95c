"""The inference child's engine, in this process: answers equal transformers' own
`generate`, adapters never leak between interleaved answers, stops, lengths, seeds,
the context limit, and models that are unloaded when they should be.

The tiny model's random weights make it repeat one token forever, which would let
a wrong answer pass; `lively_model` stirs its weights so that each step's choice
depends on what came before. Its adapters get random LoRA weights (no training).
"""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch

from finetune_studio.inference import models
from finetune_studio.inference.chat_model import BaseKey
from finetune_studio.inference.pool import ModelPool
from finetune_studio.inference.sampling import make_generator, next_token
from finetune_studio.inference.text import TextStream
from tests.helpers.inference_engine import (
    QUESTION,
    Recorder,
    answer_of,
    command,
    make_adapter,
    make_lively_model,
    reference,
)

# -- fixtures ------------------------------------------------------------------


@pytest.fixture(autouse=True)
def fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine answers in fp32 here (not bf16 where it is native), as the references are computed."""
    monkeypatch.setattr(models, "PRECISION", "fp32")


@pytest.fixture(scope="module")
def lively_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with noise on its weights: its greedy answers vary token by token."""
    return make_lively_model(tiny_model, tmp_path_factory.mktemp("lively") / "model")


@pytest.fixture(scope="module")
def adapters(lively_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return make_adapter(lively_model, root / "one", seed=1), make_adapter(lively_model, root / "two", seed=2)


# -- text and sampling (no model) ------------------------------------------------


def pieces_decoder(pieces: dict[int, bytes]) -> Any:
    return lambda ids: b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")


def test_text_holds_back_what_may_become_a_stop_and_cuts_before_it() -> None:
    stream = TextStream(pieces_decoder({1: b"Hello ", 2: b"wor", 3: b"ld", 4: b"END", 5: b"x"}), ["worldEND"])
    assert stream.push(1) == "Hello "
    assert stream.push(2) == ""  # "wor" may begin the stop
    assert stream.push(3) == ""
    assert stream.push(4) == ""
    assert stream.stopped and stream.sent == "Hello "


def test_text_releases_a_false_start_of_a_stop() -> None:
    stream = TextStream(pieces_decoder({1: b"wor", 2: b"m", 3: b"!"}), ["world"])
    assert [stream.push(1), stream.push(2)] == ["", "worm"]
    assert stream.push(3) == "!" and not stream.stopped
    assert stream.finish() == ""


def test_text_waits_for_the_rest_of_a_multibyte_character() -> None:
    euro = "€".encode()
    stream = TextStream(pieces_decoder({1: b"a" + euro[:1], 2: euro[1:2], 3: euro[2:]}), [])
    assert [stream.push(1), stream.push(2), stream.push(3)] == ["a", "", "€"]


def test_text_finish_sends_what_was_held_back() -> None:
    stream = TextStream(pieces_decoder({1: b"ab", 2: b"\xe2"}), ["bc"])
    assert stream.push(1) == "a"
    assert stream.push(2) == ""
    assert stream.finish() == "b\ufffd"


def test_sampling_greedy_is_the_argmax_and_a_tiny_top_p_keeps_only_the_best() -> None:
    logits = torch.tensor([0.1, 2.0, 1.9, -1.0])
    generator = make_generator(torch.device("cpu"), 0)
    assert next_token(logits, 0, 1.0, generator) == 1
    assert {next_token(logits, 1.0, 1e-6, generator) for _ in range(20)} == {1}
    assert len({next_token(logits, 5.0, 1.0, generator) for _ in range(200)}) == 4


@pytest.mark.parametrize("temperature", [1e-45, 1e-50, 1e-320, 5e-324])
def test_a_temperature_too_small_to_divide_by_is_greedy(temperature: float) -> None:
    """Such a temperature made the scaled logits infinite and their softmax NaN: torch.multinomial
    refused it ("probability tensor contains inf/nan"), and the chat answered 500."""
    generator = make_generator(torch.device("cpu"), 0)
    for logits in (torch.tensor([0.1, 2.0, 1.9, -1.0]), torch.tensor([-3.0, -1.0, -2.0]),  # all negative: -inf / -inf
                   torch.tensor([0.0, 30.0, float("-inf"), 29.0])):
        assert next_token(logits, temperature, 1.0, generator) == int(torch.argmax(logits))
        assert next_token(logits, temperature, 0.5, generator) == int(torch.argmax(logits))
    # The largest temperatures that still overflow, and the smallest that do not, meet at float32's limit.
    logits = torch.tensor([0.5, 30.0, 29.5])
    assert next_token(logits, 30.0 / 3.4e38 / 2, 1.0, generator) == 1
    assert {next_token(logits, 1e-30, 1.0, generator) for _ in range(20)} == {1}  # divides fine: one-hot


@pytest.mark.parametrize("top_p", [1e-320, 5e-324, 1e-45])
def test_a_top_p_too_small_for_float32_keeps_the_most_likely_token(top_p: float) -> None:
    """1e-320 is 0 in float32: every token, the most likely one too, was dropped, and
    torch.multinomial refused an all-zero distribution."""
    logits = torch.tensor([0.1, 2.0, 1.9, -1.0])
    generator = make_generator(torch.device("cpu"), 0)
    assert {next_token(logits, 1.0, top_p, generator) for _ in range(20)} == {1}
    assert {next_token(logits, 1e-45, top_p, generator) for _ in range(5)} == {1}


def test_the_child_entry_imports_no_web_framework_and_nothing_heavy() -> None:
    code = ("import sys, finetune_studio.inference.child\n"
            "print(sorted(m for m in ('torch', 'transformers', 'peft', 'fastapi', 'starlette') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# -- answers ---------------------------------------------------------------------


@pytest.mark.train
def test_greedy_answers_equal_generate_for_the_base_and_for_adapters(lively_model: Path, adapters: tuple[Path, Path]) -> None:
    one, two = adapters
    expected = {name: reference(lively_model, adapter, QUESTION, 16)
                for name, adapter in (("base", None), ("one", one), ("two", two))}
    assert len({e["text"] for e in expected.values()}) == 3, "the adapters must change the answer"
    assert len(set(expected["base"]["text"])) > 3, "the model must say more than one thing"

    alone = {}
    for name, adapter in (("base", None), ("one", one), ("two", two)):
        alone[name] = answer_of(Recorder().run(command(name, lively_model, adapter))[name])
    assert alone == expected

    # All three at once, on one base, one token each per turn: adapter state cannot leak.
    recorder = Recorder()
    together = recorder.run(command("base", lively_model), command("one", lively_model, one),
                            command("two", lively_model, two))
    assert {name: answer_of(result) for name, result in together.items()} == expected
    order = [m["id"] for m in recorder.messages if m["type"] == "delta"]
    assert order[:6] != sorted(order[:6]), f"the answers did not interleave: {order}"
    assert len(recorder.engine.pool.loaded) == 1, "one base serves all three"


@pytest.mark.train
def test_a_stop_string_cuts_the_text_and_max_tokens_gives_length(lively_model: Path) -> None:
    full = reference(lively_model, None, QUESTION, 16)
    stop = full["text"][6:9]
    cut = full["text"][: full["text"].index(stop)]
    results = Recorder().run(command("stop", lively_model, stop=["never there", stop]),
                             command("short", lively_model, max_tokens=3))
    assert (results["stop"]["text"], results["stop"]["finish_reason"]) == (cut, "stop")
    assert (results["short"]["completion_tokens"], results["short"]["finish_reason"]) == (3, "length")
    assert full["text"].startswith(results["short"]["text"])


@pytest.mark.train
def test_a_prompt_over_the_context_fails_naming_what_to_shorten(lively_model: Path) -> None:
    long = [{"role": "user", "content": "word " * 1100}]
    results = Recorder().run(command("long", lively_model, messages=long, max_tokens=None),
                             command("greedy", lively_model, max_tokens=4096))
    assert (results["long"]["failed"], results["long"]["param"]) == ("context_length_exceeded", "messages")
    assert "4096" in results["long"]["message"]
    assert (results["greedy"]["failed"], results["greedy"]["param"]) == ("context_length_exceeded", "max_tokens")


@pytest.mark.train
def test_a_seed_repeats_a_sampled_answer_and_other_seeds_differ(lively_model: Path) -> None:
    sampled = {"temperature": 1.0, "top_p": 0.95, "max_tokens": 12}
    results = Recorder().run(*(command(f"{name}", lively_model, seed=seed, **sampled)
                               for name, seed in (("a", 7), ("b", 7), ("c", 8), ("d", 9))))
    assert results["a"]["text"] == results["b"]["text"]
    assert len({results[name]["text"] for name in "acd"}) == 3
    unseeded = Recorder().run(command("x", lively_model, **sampled), command("y", lively_model, **sampled))
    assert unseeded["x"]["text"] != unseeded["y"]["text"]


@pytest.mark.train
def test_bad_requests_fail_alone(lively_model: Path, tmp_path: Path) -> None:
    recorder = Recorder()
    results = recorder.run(
        command("no-adapter", lively_model, tmp_path / "nothing"),
        command("no-model", tmp_path / "missing"),
        command("hot", lively_model, temperature=3),
        command("fine", lively_model, max_tokens=2),
    )
    assert (results["no-adapter"]["failed"], results["no-adapter"]["param"]) == ("model_not_found", "model")
    assert "adapter_config.json" in results["no-adapter"]["message"]
    assert results["no-model"]["failed"] == "model_not_found" and "missing" in results["no-model"]["message"]
    assert (results["hot"]["failed"], results["hot"]["param"]) == ("invalid_request", "temperature")
    assert results["fine"]["finish_reason"] == "length"


@pytest.mark.train
def test_a_cancelled_request_says_nothing_more(lively_model: Path) -> None:
    recorder = Recorder()
    recorder.engine.handle(command("long", lively_model, max_tokens=200))
    recorder.engine.step()
    recorder.engine.step()
    recorder.engine.handle({"type": "cancel", "id": "long"})
    seen = len(recorder.messages)
    assert not recorder.engine.busy
    recorder.run(command("next", lively_model, max_tokens=2))
    assert all(m.get("id") != "long" for m in recorder.messages[seen:])
    assert recorder.results()["next"]["finish_reason"] == "length"


# -- loading and unloading ---------------------------------------------------------


def loaded_model(recorder: Recorder, base: Path) -> Any:
    entry = recorder.engine.pool.get(BaseKey("folder", str(base), False))
    assert entry is not None
    return weakref.ref(entry.model)


def gone(reference_: Any) -> bool:
    gc.collect()
    return reference_() is None


@pytest.mark.train
def test_the_least_recently_used_base_is_unloaded_for_another(lively_model: Path, tiny_model: Path,
                                                               adapters: tuple[Path, Path]) -> None:
    recorder = Recorder(max_loaded=1)
    recorder.run(command("a", lively_model, adapters[0], max_tokens=2))
    first = loaded_model(recorder, lively_model)
    recorder.run(command("b", tiny_model, max_tokens=2))
    assert recorder.engine.pool.loaded == [BaseKey("folder", str(tiny_model), False)]
    assert gone(first), "the unloaded model is still in memory"

    # Two bases answering at once both stay for the answers' length, then the limit holds.
    together = recorder.run(command("c", lively_model, max_tokens=3), command("d", tiny_model, max_tokens=3))
    assert {r["finish_reason"] for r in together.values() if "finish_reason" in r} == {"length"}
    assert len(recorder.engine.pool.loaded) == 1


@pytest.mark.train
def test_unload_frees_idle_models_now_and_busy_ones_when_they_finish(lively_model: Path) -> None:
    recorder = Recorder(max_loaded=2)
    recorder.run(command("a", lively_model, max_tokens=1))
    model = loaded_model(recorder, lively_model)
    recorder.engine.handle({"type": "unload"})
    assert recorder.engine.pool.loaded == [] and gone(model)

    recorder.engine.handle(command("b", lively_model, max_tokens=3))
    recorder.engine.step()
    recorder.engine.handle({"type": "unload"})
    assert len(recorder.engine.pool.loaded) == 1, "a model is never unloaded under an answer"
    results = recorder.run()
    assert results["b"]["completion_tokens"] == 3
    assert recorder.engine.pool.loaded == []


@pytest.mark.train
def test_an_idle_model_is_unloaded_after_idle_seconds(lively_model: Path) -> None:
    now = [1000.0]
    recorder = Recorder(pool=ModelPool(2, 60, clock=lambda: now[0]))
    recorder.run(command("a", lively_model, max_tokens=1))
    assert recorder.engine.seconds_until_idle() == 60
    now[0] += 59
    recorder.engine.unload_idle()
    assert len(recorder.engine.pool.loaded) == 1
    now[0] += 1
    recorder.engine.unload_idle()
    assert recorder.engine.pool.loaded == [] and recorder.engine.seconds_until_idle() is None
