"""Batched decoding in the chat child's engine: the running answers of a base decode in
one forward pass per step, and each is still what it is alone.

Greedy answers of the base, two LoRA adapters and a DoRA adapter, batched together,
equal transformers' own `generate(do_sample=False)` for each alone, token for token
(fp32, the tiny model with its weights stirred: `lively`); a seeded sampled
answer draws the same tokens alone and in a batch; a cancelled request leaves its
batch at once; max_batch_size holds the others back, in order; the logprobs are a
forward pass's log_softmax. No wall-clock limits: every wait is counted in steps.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Optional

import pytest
import torch

from finetune_studio.inference import models
from finetune_studio.inference.chat_model import BaseKey
from finetune_studio.inference.models import LoadedModel
from finetune_studio.inference.pool import ModelPool
from tests.helpers import inference_engine as helpers
from tests.helpers.inference_engine import QUESTION, Recorder, answer_of, command, reference

pytestmark = pytest.mark.train

PROMPTS = [
    QUESTION,
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": "Translate hello into Spanish, please, and then say it twice in French."}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
]


@pytest.fixture(scope="module")
def lively(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its weights stirred (test_inference_engine.py's `lively_model`)."""
    return helpers.make_lively_model(tiny_model, tmp_path_factory.mktemp("lively") / "model")


@pytest.fixture(autouse=True)
def fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine answers in fp32 here, as the references are computed."""
    monkeypatch.setattr(models, "PRECISION", "fp32", raising=False)


def make_dora_adapter(base: Path, directory: Path, seed: int) -> Path:
    """A DoRA adapter (peft's use_dora) with random, non-zero weights."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False,
                        use_dora=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        get_peft_model(model, config).save_pretrained(str(directory))
    return directory


@pytest.fixture(scope="module")
def three_adapters(lively: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("batched-adapters")
    return {"one": helpers.make_adapter(lively, root / "one", seed=11), "two": helpers.make_adapter(lively, root / "two", seed=12),
            "dora": make_dora_adapter(lively, root / "dora", seed=13)}


class Observer(Recorder):
    """A recorder that also counts the batched forward passes of each step and keeps
    what the batches were after each step."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, **options: Any) -> None:
        super().__init__(**options)
        self.passes: list[list[int]] = [[]]  # per step: the rows of each batched forward pass
        self.prefills: list[list[int]] = [[]]  # per step: the rows of each batched prefill (more than one column)
        self.seen: list[list[list[str]]] = []  # per step: the batches after it
        self.running: list[int] = []
        original = LoadedModel.forward_rows

        def counting(model: LoadedModel, input_ids: torch.Tensor, *args: Any) -> torch.Tensor:
            self.passes[-1].append(int(input_ids.shape[0]))
            if input_ids.shape[1] > 1:
                self.prefills[-1].append(int(input_ids.shape[0]))
            return original(model, input_ids, *args)

        monkeypatch.setattr(LoadedModel, "forward_rows", counting)

    def step(self) -> None:
        self.engine.step()
        self.seen.append(self.engine.batches())
        self.running.append(self.engine.running)
        self.passes.append([])
        self.prefills.append([])

    def ids_of(self, request_id: str) -> list[int]:
        """The tokens of an answer that asked for logprobs."""
        return [entry["id"] for m in self.messages if m["type"] == "delta" and m["id"] == request_id
                for entry in m.get("logprobs", [])]


def adapter_path(adapters: dict[str, Path], name: Optional[str]) -> Optional[Path]:
    return adapters[name] if name is not None else None


# -- greedy answers ------------------------------------------------------------------


def test_eight_mixed_answers_in_one_batch_each_equal_their_own_generate(
    lively: Path, three_adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # name: (adapter, prompt, max_tokens); different prompt lengths (left padding) and lengths (rows leave)
    cases: dict[str, tuple[Optional[str], int, int]] = {
        "base-1": (None, 0, 16), "one-1": ("one", 1, 12), "two-1": ("two", 2, 16), "dora-1": ("dora", 3, 14),
        "base-2": (None, 2, 10), "one-2": ("one", 3, 16), "dora-2": ("dora", 0, 16), "two-2": ("two", 1, 8),
    }
    expected = {name: reference(lively, adapter_path(three_adapters, adapter), PROMPTS[prompt], tokens)
                for name, (adapter, prompt, tokens) in cases.items()}
    assert len({e["text"] for e in expected.values()}) == 8, "every answer must be its own"
    commands = [command(name, lively, adapter_path(three_adapters, adapter), messages=PROMPTS[prompt],
                        max_tokens=tokens) for name, (adapter, prompt, tokens) in cases.items()]

    observer = Observer(monkeypatch)
    for item in commands[:4]:
        observer.engine.handle(item)
    for _ in range(3):  # four answers run, then four more join them
        observer.step()
    results = observer.run(*commands[4:])

    assert {name: answer_of(result) for name, result in results.items()} == expected
    # The base and its two LoRA adapters in one batch (peft's adapter_names), the DoRA adapter's in its own.
    together = [sorted(len(batch) for batch in batches) for batches in observer.seen]
    assert [2, 6] in together, together
    full = together.index([2, 6])
    assert sorted(observer.passes[full + 1]) == [2, 6], "one forward pass per batch and step"
    assert sorted(observer.seen[full], key=len)[1] == ["base-1", "one-1", "two-1", "base-2", "one-2", "two-2"]
    assert len(observer.engine.pool.loaded) == 1 and observer.engine.batches() == []


def test_the_base_and_adapters_answer_as_themselves_whatever_ran_before(
    lively: Path, three_adapters: dict[str, Path]
) -> None:
    # The adapter layers stay switched as the last forward pass left them (models.py): each
    # answer below follows one that needed them the other way.
    order: list[Optional[str]] = ["one", None, "dora", None, "two", "one", None]
    expected = {name: reference(lively, adapter_path(three_adapters, name), QUESTION, 8) for name in set(order)}
    recorder = Recorder()
    for i, name in enumerate(order):
        result = recorder.run(command(f"{i}", lively, adapter_path(three_adapters, name), max_tokens=8))[f"{i}"]
        assert answer_of(result) == expected[name], (i, name)
    # A base row beside a DoRA batch: the DoRA pass switches the layers on, the base's off again.
    together = recorder.run(command("base", lively, max_tokens=8), command("dora", lively, three_adapters["dora"], max_tokens=8))
    assert {name: answer_of(together[name]) for name in ("base", "dora")} == {"base": expected[None], "dora": expected["dora"]}


def test_a_seeded_sampled_answer_draws_the_same_tokens_alone_and_in_a_batch(
    lively: Path, three_adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    sampled = {"temperature": 0.9, "top_p": 0.9, "max_tokens": 16, "logprobs": True}
    mine = command("mine", lively, three_adapters["one"], seed=1234, messages=PROMPTS[1], **sampled)
    alone = Observer(monkeypatch)
    alone.run(mine)
    others = [
        command("greedy", lively, messages=PROMPTS[2], max_tokens=20),
        command("other-seed", lively, three_adapters["two"], seed=99, messages=PROMPTS[0], **sampled),
        command("dora", lively, three_adapters["dora"], temperature=1.0, messages=PROMPTS[3], max_tokens=20),
        command("unseeded", lively, three_adapters["one"], temperature=1.2, messages=PROMPTS[0], max_tokens=20),
    ]
    batched = Observer(monkeypatch)
    for item in others[:2]:
        batched.engine.handle(item)
    batched.step()
    batched.run(mine, *others[2:])

    assert len(alone.ids_of("mine")) == 16
    assert batched.ids_of("mine") == alone.ids_of("mine")
    assert any("mine" in batch and len(batch) >= 3 for batches in batched.seen for batch in batches), batched.seen
    other = Observer(monkeypatch)
    other.run(command("mine", lively, three_adapters["one"], seed=4321, messages=PROMPTS[1], **sampled))
    assert other.ids_of("mine") != alone.ids_of("mine"), "another seed draws another answer"


# -- starting together ------------------------------------------------------------------


def test_requests_that_arrive_together_are_prefilled_in_one_pass_and_answer_as_alone(
    lively: Path, three_adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prompts of different lengths (the shorter rows left-padded), the base and two LoRA adapters
    # (peft's mixed rows), and a DoRA adapter's, which prefills in its own pass.
    cases: dict[str, tuple[Optional[str], int, int]] = {
        "base": (None, 2, 12), "one": ("one", 1, 10), "two": ("two", 3, 12), "base-short": (None, 1, 1),
        "dora": ("dora", 0, 8),
    }
    expected = {name: reference(lively, adapter_path(three_adapters, adapter), PROMPTS[prompt], tokens)
                for name, (adapter, prompt, tokens) in cases.items()}
    observer = Observer(monkeypatch)
    results = observer.run(*(command(name, lively, adapter_path(three_adapters, adapter), messages=PROMPTS[prompt],
                                     max_tokens=tokens) for name, (adapter, prompt, tokens) in cases.items()))

    assert {name: answer_of(result) for name, result in results.items()} == expected
    assert observer.prefills[0] == [4], "the four LoRA-lane prompts in one pass (the DoRA one alone, unbatched)"
    assert all(not rows for rows in observer.prefills[1:]), "nothing else to prefill"
    assert observer.seen[0] and sorted(len(batch) for batch in observer.seen[0]) == [1, 3], \
        "base-short ended at its first token and never joined"
    assert observer.engine.batches() == []


def test_prompt_logprobs_prefilled_together_are_each_prompts_own(
    lively: Path, three_adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The held-out evaluation's loss pass: echo the prompt's logprobs, no answer (max_tokens 0).
    texts = ["The river runs to the sea.", "A low-rank adapter trains a few weights of a large model, fast.", "Hi"]
    observer = Observer(monkeypatch)
    asked = [command(f"p{i}", lively, three_adapters["one"] if i % 2 else None, messages=[{"role": "user", "content": text}],
                     max_tokens=0, prompt_logprobs=True, logprobs=True, top_logprobs=2)
             for i, text in enumerate(texts)]
    answered = command("answer", lively, messages=PROMPTS[1], max_tokens=6)  # wants no prompt logprobs: prefilled apart
    results = observer.run(*asked, answered)

    assert sorted(observer.prefills[0]) == [3], "the three loss passes in one pass; the answer's prompt alone"
    assert observer.seen[0] == [["answer"]], "a request with max_tokens 0 never joins a batch"
    assert answer_of(results["answer"]) == reference(lively, None, PROMPTS[1], 6)
    for i in range(len(texts)):
        (started,) = [m for m in observer.messages if m["type"] == "started" and m["id"] == f"p{i}"]
        ids = [entry["id"] for entry in started["prompt_logprobs"]]
        assert len(ids) == results[f"p{i}"]["prompt_tokens"] and results[f"p{i}"]["completion_tokens"] == 0
        truth = forward_logprobs(lively, three_adapters["one"] if i % 2 else None, ids)
        assert started["prompt_logprobs"][0]["logprob"] is None
        for j, entry in enumerate(started["prompt_logprobs"][1:]):
            assert entry["logprob"] == pytest.approx(float(truth[j, entry["id"]]), abs=1e-4), (i, j)
            assert [top["id"] for top in entry["top_logprobs"]] == torch.topk(truth[j], 2).indices.tolist()


# -- kept prompts (prefix.py) -----------------------------------------------------------


def test_an_answer_whose_prompt_begins_as_a_scored_one_prefills_only_the_rest_and_answers_as_alone(
    lively: Path, three_adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A held-out row: the loss pass (the conversation with its reference answer, prompt logprobs,
    # no new token), then the model's own answer to the conversation, whose prompt is its start.
    scored = [*PROMPTS[2], {"role": "assistant", "content": "Hola, hola. Bonjour, bonjour."}]
    fed: list[int] = []  # the tokens of each lone forward pass
    original = LoadedModel.forward

    def counting(model: LoadedModel, ids: list[int], *args: Any, **kwargs: Any) -> torch.Tensor:
        fed.append(len(ids))
        return original(model, ids, *args, **kwargs)

    monkeypatch.setattr(LoadedModel, "forward", counting)
    recorder = Recorder()
    engine = recorder.engine
    recorder.run(command("loss", lively, messages=scored, max_tokens=0, prompt_logprobs=True, logprobs=True))
    assert len(engine.prefixes) == 1 and engine.prefixes.hits == 0
    fed.clear()
    answer = recorder.run(command("answer", lively, messages=PROMPTS[2], max_tokens=12))["answer"]

    assert answer_of(answer) == reference(lively, None, PROMPTS[2], 12)
    assert engine.prefixes.hits == 1 and engine.prefixes.reused_tokens == answer["prompt_tokens"] - 1
    assert fed == [], "no pass of its own: its start came from the loss pass, its last token ran in a decode step"

    # Another adapter's weights make other keys and values: nothing kept is used for it.
    other = recorder.run(command("other", lively, three_adapters["one"], messages=PROMPTS[2], max_tokens=12))["other"]
    assert answer_of(other) == reference(lively, three_adapters["one"], PROMPTS[2], 12)
    assert engine.prefixes.hits == 1
    # A conversation's next turn resends the last one: its start is the prompt kept from that turn.
    turn = [*PROMPTS[2], {"role": "assistant", "content": answer["text"]}, {"role": "user", "content": "Again?"}]
    again = recorder.run(command("again", lively, messages=turn, max_tokens=8))["again"]
    assert answer_of(again) == reference(lively, None, turn, 8)
    assert engine.prefixes.hits == 2

    # What was kept for a model goes with it when it unloads.
    engine.handle({"type": "unload"})
    assert len(engine.prefixes) == 0 and engine.prefixes.bytes == 0
    recorder.run(command("fresh", lively, messages=PROMPTS[0], max_tokens=2))
    assert engine.prefixes.hits == 2 and len(engine.prefixes) == 1  # the fresh prompt only, of the model loaded again


SCORED = {"role": "assistant", "content": "Hola, hola. Bonjour, bonjour, le monde."}


def scored_rows(monkeypatch: pytest.MonkeyPatch, lively: Path, adapters: dict[str, Path],
                rows: dict[str, tuple[Optional[str], list[dict[str, str]]]]) -> tuple[Observer, list[int]]:
    """An engine that has run each row's loss pass (its conversation with SCORED as the answer:
    prompt logprobs, no new token), with its passes counted from here on; and the list of the
    tokens of each lone forward pass (LoadedModel.forward) from here on."""
    lone: list[int] = []
    original = LoadedModel.forward

    def counting(model: LoadedModel, ids: list[int], *args: Any, **kwargs: Any) -> torch.Tensor:
        lone.append(len(ids))
        return original(model, ids, *args, **kwargs)

    monkeypatch.setattr(LoadedModel, "forward", counting)
    observer = Observer(monkeypatch)
    observer.run(*(command(f"loss-{name}", lively, adapter_path(adapters, adapter), messages=[*prompt, SCORED], max_tokens=0,
                           prompt_logprobs=True, logprobs=True) for name, (adapter, prompt) in rows.items()))
    assert len(observer.engine.prefixes) == len(rows) and observer.engine.prefixes.hits == 0
    lone.clear()
    observer.passes, observer.prefills, observer.seen = [[]], [[]], []
    return observer, lone


def test_answers_whose_prompts_begin_as_scored_ones_join_the_batch_with_no_pass_of_their_own(
    lively: Path, three_adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An evaluation's rows: each row's loss pass first, then the answers, which arrive together.
    # Each answer's prompt is the start of its row's scored text but for its last token (a different
    # length in each row: the kept rows are left-padded), through the base and an adapter (mixed rows).
    rows = {"base-a": (None, PROMPTS[0]), "one-b": ("one", PROMPTS[2]), "base-c": (None, PROMPTS[3])}
    observer, lone = scored_rows(monkeypatch, lively, three_adapters, rows)
    expected = {name: reference(lively, adapter_path(three_adapters, adapter), prompt, 10) for name, (adapter, prompt) in rows.items()}
    answers = observer.run(*(command(name, lively, adapter_path(three_adapters, adapter), messages=prompt, max_tokens=10)
                             for name, (adapter, prompt) in rows.items()))

    assert {name: answer_of(answers[name]) for name in rows} == expected
    engine = observer.engine
    assert engine.prefixes.hits == 3
    assert engine.prefixes.reused_tokens == sum(answers[name]["prompt_tokens"] - 1 for name in rows)
    assert lone == [] and observer.passes[0] == [], "no answer had a pass of its own: they joined their batch"
    assert observer.seen[0] == [list(rows)], "in one batch"
    assert observer.passes[1] == [3], "whose first decode step ran their prompts' last tokens, together"


def test_next_turns_after_scored_ones_prefill_together_on_their_kept_starts(
    lively: Path, three_adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each row's next turn begins as its scored text: the same follow-up after each, so as many
    # tokens after each kept start, run in one pass on top of the kept rows (left-padded).
    rows = {"base-a": (None, PROMPTS[0]), "one-b": ("one", PROMPTS[2])}
    observer, lone = scored_rows(monkeypatch, lively, three_adapters, rows)
    turns = {name: [*prompt, SCORED, {"role": "user", "content": "And again, in French?"}] for name, (_, prompt) in rows.items()}
    expected = {name: reference(lively, adapter_path(three_adapters, adapter), turns[name], 8) for name, (adapter, _) in rows.items()}
    answers = observer.run(*(command(name, lively, adapter_path(three_adapters, adapter), messages=turns[name], max_tokens=8)
                             for name, (adapter, _) in rows.items()))

    assert {name: answer_of(answers[name]) for name in rows} == expected
    assert observer.engine.prefixes.hits == 2 and lone == []
    assert observer.prefills[0] == [2], "both turns' new tokens in one pass, on their kept starts"


def test_kept_prompts_stay_within_their_bytes_and_the_longest_shared_start_of_the_same_model_is_found() -> None:
    from types import SimpleNamespace

    from finetune_studio.inference.prefix import PrefixCache

    def cache(columns: int, rows: int = 1) -> Any:
        layer = SimpleNamespace(keys=torch.randn(rows, 2, columns, 4), values=torch.randn(rows, 2, columns, 4))
        return SimpleNamespace(layers=[layer, SimpleNamespace(**vars(layer))])

    class Model:
        pass

    model, other = Model(), Model()
    kept = PrefixCache(min_shared=4)
    one = list(range(20))
    kept.keep(model, None, one, cache(20))
    size = kept.bytes
    assert size == 2 * 2 * (2 * 20 * 4) * 4  # two layers, keys and values, fp32
    kept.max_bytes = int(size * 2.5)
    kept.keep(model, None, [*one[:10], 99, 98, 97], cache(13))
    kept.keep(model, None, [7, 7, 7], cache(3))  # shorter than min_shared: not kept
    assert len(kept) == 2

    found = kept.longest(model, None, [*one[:15], 5, 5])
    assert found is not None and found[0].tokens == tuple(one) and found[1] == 15  # the longer of the two shared starts
    assert kept.longest(model, None, one)[1] == 19, "the last token is always prefilled"  # type: ignore[index]
    assert kept.longest(model, "adapter", one) is None and kept.longest(other, None, one) is None
    assert kept.longest(model, None, [1, 2, 3, 4, 5]) is None  # starts differently

    # A row of a left-padded batch keeps its own columns; a third prompt pushes out the least recently used.
    padded = cache(30, rows=2)
    kept.keep(model, None, list(range(100, 120)), padded, row=1, pad=10)
    assert len(kept) == 2 and kept.bytes <= kept.max_bytes
    gone = kept.longest(model, None, [*one[:10], 99, 98, 97, 1])  # 13 shared with the one that went, 10 with the first
    assert gone is not None and gone[0].tokens == tuple(one) and gone[1] == 10, "the least recently used went first"
    newest = kept.longest(model, None, list(range(100, 125)))
    assert newest is not None and torch.equal(newest[0].keys[0], padded.layers[0].keys[1:2, :, 10:30])
    kept.forget([other])
    assert len(kept) == 0 and kept.bytes == 0


# -- leaving and waiting ----------------------------------------------------------------


def test_a_request_cancelled_mid_batch_leaves_it_at_once_and_the_others_finish(
    lively: Path, three_adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cases = {"base": (None, 0), "one": ("one", 2), "two": ("two", 1), "long": (None, 2)}
    expected = {name: reference(lively, adapter_path(three_adapters, adapter), PROMPTS[prompt], 24)
                for name, (adapter, prompt) in cases.items() if name != "long"}
    observer = Observer(monkeypatch)
    for name, (adapter, prompt) in cases.items():
        observer.engine.handle(command(name, lively, adapter_path(three_adapters, adapter),
                                       messages=PROMPTS[prompt], max_tokens=24))
    for _ in range(4):
        observer.step()
    (batch,) = observer.engine.decode_batches
    assert batch.members == ["base", "one", "two", "long"]
    width = batch.width
    observer.engine.handle({"type": "cancel", "id": "one"})  # the longest prompt of the batch, with "long"
    observer.engine.handle({"type": "cancel", "id": "long"})
    seen = len(observer.messages)
    # Gone from the batch at once: its row and the columns only it needed.
    assert batch.members == ["base", "two"] and batch.pads.count(0) >= 1 and batch.width < width
    assert all(layer.keys.shape[0] == 2 and layer.keys.shape[2] == batch.width for layer in batch.cache.layers)
    assert observer.engine.running == 2
    results = observer.run()
    assert all(m.get("id") not in ("one", "long") for m in observer.messages[seen:])
    assert {name: answer_of(results[name]) for name in ("base", "two")} == {name: expected[name] for name in ("base", "two")}
    assert observer.engine.batches() == [] and observer.engine.running == 0


def test_max_batch_size_holds_the_rest_back_in_order(lively: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    observer = Observer(monkeypatch, max_batch_size=3)
    lengths = {"a": 4, "b": 8, "c": 8, "d": 3, "e": 3}
    for name, tokens in lengths.items():
        observer.engine.handle(command(name, lively, max_tokens=tokens, messages=PROMPTS[1]))
    observer.step()
    assert observer.engine.waiting == ["d", "e"] and observer.engine.running == 3
    results = observer.run()
    assert max(observer.running) == 3
    assert max(len(passes) for passes in observer.passes) == 1, "one batched forward pass per step"
    assert max(rows for passes in observer.passes for rows in passes) == 3
    order = [(m["type"], m["id"]) for m in observer.messages if m["type"] in ("started", "done")]
    assert order.index(("started", "d")) > order.index(("done", "a")), order
    assert order.index(("started", "e")) > order.index(("started", "d"))
    assert order.index(("started", "e")) > [i for i, (kind, _) in enumerate(order) if kind == "done"][1], order
    assert {name: (r["completion_tokens"], r["finish_reason"]) for name, r in results.items()} == {
        name: (tokens, "length") for name, tokens in lengths.items()}


def test_a_cancelled_request_frees_its_slot_for_the_next(lively: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    observer = Observer(monkeypatch, max_batch_size=1)
    observer.engine.handle(command("long", lively, max_tokens=200))
    observer.engine.handle(command("next", lively, max_tokens=3))
    for _ in range(3):
        observer.step()
    assert observer.engine.waiting == ["next"] and observer.engine.batches() == [["long"]]
    observer.engine.handle({"type": "cancel", "id": "long"})
    assert observer.engine.batches() == [] and observer.engine.running == 0
    observer.step()  # the next one starts at once
    assert observer.engine.batches() == [["next"]]
    assert observer.run()["next"]["completion_tokens"] == 3


# -- logprobs -------------------------------------------------------------------------------


def forward_logprobs(base: Path, adapter: Optional[Path], ids: list[int]) -> torch.Tensor:
    """log_softmax of one plain forward pass over `ids` (transformers + peft, fp32): row j
    is the distribution of the token after ids[j]."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model = PeftModel.from_pretrained(model, str(adapter))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def test_the_logprobs_of_a_greedy_answer_are_a_forward_pass_log_softmax(
    lively: Path, three_adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    asked = command("asked", lively, three_adapters["one"], messages=PROMPTS[1], max_tokens=12, logprobs=True,
                    top_logprobs=5, prompt_logprobs=True)
    observer = Observer(monkeypatch)
    results = observer.run(
        command("long-prompt", lively, messages=PROMPTS[2], max_tokens=14),  # pads the short one's row
        command("other", lively, three_adapters["two"], messages=PROMPTS[0], max_tokens=14),
        asked,
    )
    assert any("asked" in batch and len(batch) == 3 for batches in observer.seen for batch in batches)
    (started,) = [m for m in observer.messages if m["type"] == "started" and m["id"] == "asked"]
    prompt = [entry["id"] for entry in started["prompt_logprobs"]]
    answer = [entry for m in observer.messages if m["type"] == "delta" and m["id"] == "asked" for entry in m.get("logprobs", [])]
    completion = [entry["id"] for entry in answer]
    assert len(prompt) == results["asked"]["prompt_tokens"] and len(completion) == results["asked"]["completion_tokens"] == 12

    tokenizer = AutoTokenizer.from_pretrained(str(lively))
    expected_prompt = tokenizer.apply_chat_template(PROMPTS[1], add_generation_prompt=True, tokenize=True, return_dict=True)
    assert prompt == list(expected_prompt["input_ids"])
    truth = forward_logprobs(lively, three_adapters["one"], prompt + completion)

    def check(entry: dict[str, Any], row: int) -> None:
        assert entry["logprob"] == pytest.approx(float(truth[row, entry["id"]]), abs=1e-4)
        values, ids = torch.topk(truth[row], 5)
        assert [top["id"] for top in entry["top_logprobs"]] == ids.tolist()
        assert [top["logprob"] for top in entry["top_logprobs"]] == pytest.approx(values.tolist(), abs=1e-4)

    assert started["prompt_logprobs"][0]["logprob"] is None and started["prompt_logprobs"][0]["top_logprobs"] == []
    for j, entry in enumerate(started["prompt_logprobs"][1:]):
        check(entry, j)
    for t, entry in enumerate(answer):
        check(entry, len(prompt) - 1 + t)
        assert entry["top_logprobs"][0]["id"] == entry["id"], "greedy picks the most likely token"
    # The bytes of the answer's tokens are its text.
    special = set(tokenizer.all_special_ids)
    text = b"".join(bytes(entry["bytes"]) for entry in answer if entry["id"] not in special).decode("utf-8", errors="replace")
    assert text == results["asked"]["text"]
    # The others asked for none.
    assert all("logprobs" not in m for m in observer.messages if m.get("id") != "asked")
    assert all("prompt_logprobs" not in m for m in observer.messages if m.get("id") != "asked")


@pytest.mark.parametrize(("given", "param"), [
    ({"logprobs": True, "top_logprobs": 6}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": "yes"}, "logprobs"),
    ({"prompt_logprobs": 1}, "prompt_logprobs"),
])
def test_logprob_parameters_are_checked(lively: Path, given: dict[str, Any], param: str) -> None:
    results = Recorder().run(command("bad", lively, **given))
    assert (results["bad"]["failed"], results["bad"]["param"]) == ("invalid_request", param)


# -- a model that is not batched ----------------------------------------------------------


class Unbatched:
    """A ChatModel that decodes each answer alone (as llama.cpp's does): it counts its
    forward passes; its next token is the last one plus one."""

    def __init__(self, key: BaseKey) -> None:
        self.key = key
        self.device = torch.device("cpu")
        self.users = 0
        self.last_used = 0.0
        self.draining = False
        self.context_length = 64
        self.eos_ids = frozenset({0})
        self.passes: list[int] = []

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return [1, 2, len(messages[-1]["content"]) % 5 + 3]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)

    def token_bytes(self, token: int) -> bytes:
        return self.decode([token]).encode()

    def use_adapter(self, folder: str) -> str:
        return folder

    def release_adapter(self, name: str) -> None:
        pass

    def batch_lane(self, adapter: Optional[str]) -> Optional[str]:
        return None

    def new_cache(self, tokens: int) -> list[int]:
        return []

    def forward(self, ids: list[int], cache: Any, seen: int, adapter: Optional[str], all_positions: bool = False) -> torch.Tensor:
        assert len(cache) == seen
        cache.extend(ids)
        self.passes.append(len(ids))
        logits = torch.zeros(40)
        logits[(ids[-1] + 1) % 40] = 10.0
        return logits

    def close(self) -> None:
        pass


def test_a_model_without_batches_decodes_each_answer_alone() -> None:
    loaded: list[Unbatched] = []

    def load(key: BaseKey) -> Unbatched:
        loaded.append(Unbatched(key))
        return loaded[-1]

    recorder = Recorder(pool=ModelPool(1, 0, loader=load))
    model = {"base": {"kind": "gguf", "location": "/nowhere/model.gguf"}, "adapter": None, "trust_remote_code": False,
             "backend": "llama_cpp"}
    results = recorder.run(*({"type": "generate", "id": name, "model": model, "messages": [{"role": "user", "content": name}],
                              "params": {"temperature": 0, "top_p": 1, "max_tokens": 4, "stop": [], "seed": None,
                                         "logprobs": True}} for name in ("x", "yy")))
    assert recorder.engine.batches() == []
    assert loaded[0].passes == [3, 3, 1, 1, 1, 1, 1, 1], "a prefill each, then one pass per answer and step"
    assert {name: r["text"] for name, r in results.items()} == {"x": "fghi", "yy": "ghij"}
    assert [len(m["logprobs"]) for m in recorder.messages if m["type"] == "delta"] == [1] * 8
