"""`POST /v1/completions` end to end: a real server, the real chat child (fp32), and the official
`openai` SDK's `client.completions.create` as the client, over the tiny model.

Every number is checked against transformers itself in this process, on the same weights:
the echoed prompt's log-probabilities and top alternatives equal `log_softmax` of one forward
pass within 1e-4, a greedy answer is `generate(do_sample=False)`'s, token-id prompts are used
and echoed exactly as given. One server serves the module (a played training job names the
tiny model as its base: `tiny/base`); the machine has two cores.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from finetune_studio.config import Settings
from tests.helpers.evaluations import AdapterLauncher, rows_file, trained
from tests.helpers.paths import REPO
from tests.helpers.servers import LiveServer

pytestmark = pytest.mark.slow

MODEL = "tiny/base"  # the played job's model_name: a base /v1/models lists
TEXT = "The quick brown fox jumps over the lazy dog. What is the capital of France?"
TOLERANCE = 1e-4


@dataclass
class Served:
    server: LiveServer
    sdk: openai.OpenAI
    tokenizer: Any
    model: Any  # the tiny model in fp32, as transformers loads it

    def log_softmax(self, ids: list[int]) -> Any:
        """`[len(ids), vocab]`: row j is the distribution of the token after ids[: j + 1]."""
        import torch

        with torch.no_grad():
            return torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), dim=-1)

    def greedy(self, ids: list[int], tokens: int) -> list[int]:
        import torch

        with torch.no_grad():
            out = self.model.generate(torch.tensor([ids]), attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
                                      do_sample=False, max_new_tokens=tokens, pad_token_id=self.tokenizer.pad_token_id)
        return [int(token) for token in out[0, len(ids):]]

    def text_of(self, token: int) -> str:
        return str(self.tokenizer.convert_tokens_to_string([self.tokenizer.convert_ids_to_tokens(token)]))

    def ids(self, text: str) -> list[int]:
        return [int(token) for token in self.tokenizer(text, add_special_tokens=False)["input_ids"]]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Served]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("completions")
    settings = Settings(data_dir=root / "data", inference_precision="fp32")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        with LiveServer(settings, AdapterLauncher(tiny_model)) as server:
            with server.client() as client:
                trained(client, rows_file(root / "train.jsonl", ["hi"]))
            sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=600)
            tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
            model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype="float32").eval()
            yield Served(server, sdk, tokenizer, model)
            sdk.close()


def assert_prompt_logprobs(served: Served, ids: list[int], logprobs: Any, top: int) -> None:
    """The echoed prompt's entries against one transformers forward pass over exactly `ids`."""
    expected = served.log_softmax(ids)
    assert len(logprobs.token_logprobs) >= len(ids)
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    for position in range(1, len(ids)):
        row = expected[position - 1]
        assert math.isclose(logprobs.token_logprobs[position], float(row[ids[position]]), abs_tol=TOLERANCE), position
        alternatives = logprobs.top_logprobs[position]
        best = row.topk(top)
        named: dict[str, float] = {}  # two tokens of one text (parts of characters): the likelier is named
        for value, token in zip(best.values.tolist(), best.indices.tolist(), strict=True):
            named.setdefault(served.text_of(token), value)
        for name, value in named.items():
            assert math.isclose(alternatives[name], value, abs_tol=TOLERANCE), (position, name)
        # The chosen token is listed beside them, from the same tensor (lm-eval's is_greedy compares the two).
        chosen = logprobs.tokens[position]
        assert alternatives[chosen] == (logprobs.token_logprobs[position] if chosen not in named else alternatives[chosen])
        assert set(alternatives) == {*named, chosen}


def test_echo_with_no_answer_gives_the_prompts_own_logprobs(served: Served) -> None:
    answer = served.sdk.completions.create(model=MODEL, prompt=TEXT, echo=True, logprobs=2, max_tokens=0)
    ids = served.ids(TEXT)
    choice = answer.choices[0]
    assert answer.object == "text_completion" and choice.text == TEXT and choice.finish_reason == "length"
    assert choice.logprobs is not None
    assert len(choice.logprobs.tokens) == len(ids)
    assert_prompt_logprobs(served, ids, choice.logprobs, top=2)
    # Each token starts where its text does in the echoed prompt.
    encoded = served.tokenizer(TEXT, add_special_tokens=False, return_offsets_mapping=True)
    assert choice.logprobs.text_offset == [start for start, _ in encoded["offset_mapping"]]
    assert "".join(choice.logprobs.tokens) == TEXT
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (len(ids), 0, len(ids))


def test_a_greedy_answer_is_generates_own_and_its_logprobs_are_the_models(served: Served) -> None:
    ids = served.ids(TEXT)
    expected = served.greedy(ids, 12)
    answer = served.sdk.completions.create(model=MODEL, prompt=TEXT, max_tokens=12, temperature=0, logprobs=1)
    choice = answer.choices[0]
    ends = served.model.generation_config.eos_token_id
    eos = set(ends if isinstance(ends, list) else [ends])
    shown = expected[: next((i for i, token in enumerate(expected) if token in eos), len(expected))]
    assert choice.text == served.tokenizer.decode(shown, skip_special_tokens=True)
    assert choice.finish_reason == ("stop" if len(shown) < len(expected) else "length")
    # The answer's tokens (an end-of-text token that ended it included), each from the forward pass over what came before.
    generated = expected[: len(shown) + (1 if len(shown) < len(expected) else 0)]
    assert choice.logprobs is not None and len(choice.logprobs.tokens) == len(generated)
    rows = served.log_softmax(ids + generated)
    for k, token in enumerate(generated):
        row = rows[len(ids) - 1 + k]
        assert math.isclose(choice.logprobs.token_logprobs[k], float(row[token]), abs_tol=TOLERANCE)
        assert choice.logprobs.token_logprobs[k] == max(choice.logprobs.top_logprobs[k].values())  # greedy: the best
    assert choice.logprobs.text_offset[0] == 0
    assert answer.usage is not None and answer.usage.completion_tokens == len(generated)
    # With echo, the prompt's tokens come first, then the same answer.
    echoed = served.sdk.completions.create(model=MODEL, prompt=TEXT, max_tokens=12, temperature=0, logprobs=1, echo=True)
    assert echoed.choices[0].text == TEXT + choice.text
    assert echoed.choices[0].logprobs is not None
    assert echoed.choices[0].logprobs.token_logprobs[len(ids):] == pytest.approx(choice.logprobs.token_logprobs, abs=TOLERANCE)
    assert echoed.choices[0].logprobs.text_offset[len(ids)] == len(TEXT)


def test_token_prompts_are_used_and_echoed_exactly_as_given(served: Served) -> None:
    tokenizer = served.tokenizer
    # Ids no tokenizer would give for their text: a word spelled a character at a time, a special token inside.
    spelled = [tokenizer.convert_tokens_to_ids(char) for char in "capital"]
    first = served.ids("Paris is the") + spelled + [tokenizer.convert_tokens_to_ids("<|im_start|>")] + served.ids(" of France")
    second = served.ids("Two plus two is")
    answer = served.sdk.completions.create(model=MODEL, prompt=[first, second], echo=True, logprobs=3, max_tokens=0)
    assert [choice.index for choice in answer.choices] == [0, 1]
    for ids, choice in zip([first, second], answer.choices, strict=True):
        assert choice.logprobs is not None and len(choice.logprobs.tokens) == len(ids)
        assert choice.logprobs.tokens == [served.text_of(t) for t in ids]
        assert choice.text == "".join(choice.logprobs.tokens)
        assert_prompt_logprobs(served, ids, choice.logprobs, top=3)
    assert answer.usage is not None and answer.usage.prompt_tokens == len(first) + len(second)


def test_a_streamed_answer_is_the_whole_answer_in_parts(served: Served) -> None:
    body: dict[str, Any] = {"model": MODEL, "prompt": [TEXT, "Two plus two is"], "max_tokens": 10, "temperature": 0,
                            "logprobs": 1, "echo": True}
    whole = served.sdk.completions.create(**body)
    stream = served.sdk.completions.create(**body, stream=True, stream_options={"include_usage": True})
    texts = {0: "", 1: ""}
    tokens: dict[int, list[str]] = {0: [], 1: []}
    offsets: dict[int, list[int]] = {0: [], 1: []}
    finished, usage = {}, None
    for chunk in stream:
        assert chunk.object == "text_completion"
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.logprobs is not None:
                tokens[choice.index] += choice.logprobs.tokens or []
                offsets[choice.index] += choice.logprobs.text_offset or []
            if choice.finish_reason is not None:
                finished[choice.index] = choice.finish_reason
    for choice in whole.choices:
        assert choice.logprobs is not None
        assert texts[choice.index] == choice.text and tokens[choice.index] == choice.logprobs.tokens
        assert offsets[choice.index] == choice.logprobs.text_offset and finished[choice.index] == choice.finish_reason
    assert usage is not None and whole.usage is not None and usage.total_tokens == whole.usage.total_tokens


def test_n_and_a_seed_repeat_their_choices(served: Served) -> None:
    body: dict[str, Any] = {"model": MODEL, "prompt": "Once", "max_tokens": 8, "temperature": 1.0, "seed": 7, "n": 3}
    first = served.sdk.completions.create(**body)
    again = served.sdk.completions.create(**body)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    # Choice j draws with seed + j: the second choice of seed 7 is the first of seed 8.
    eight = served.sdk.completions.create(**{**body, "seed": 8, "n": 1})
    assert eight.choices[0].text == first.choices[1].text


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": 6}, "logprobs"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [[]]}, "prompt"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": [10**6]}, "prompt"),  # beyond the vocabulary: the chat child says so
        ({"prompt": "hello " * 5000}, "prompt"),  # over the context
        ({"prompt": "hello", "max_tokens": 5000}, "max_tokens"),
        ({"suffix": "and then"}, "suffix"),
        ({"best_of": 2}, "best_of"),
        ({"temperature": 3}, "temperature"),
        ({"n": 0}, "n"),
        ({"prompt": ["a"] * 200, "n": 2}, None),  # too many choices: the request as a whole
    ],
)
def test_bad_fields_are_a_400_that_names_them(served: Served, fields: dict[str, Any], param: Any) -> None:
    body = {"model": MODEL, "prompt": "hello", **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        served.sdk.completions.create(**body)
    error = caught.value.body
    assert isinstance(error, dict) and error.get("param") == param, error
    assert error.get("message")


def test_an_unknown_model_is_a_404_and_a_bad_body_names_its_field(served: Served) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        served.sdk.completions.create(model="no-such-model", prompt="hi", max_tokens=1)
    assert isinstance(caught.value.body, dict) and caught.value.body.get("code") == "model_not_found"
    answer = httpx.post(f"{served.server.url}/v1/completions", json={"model": MODEL}, timeout=60)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "prompt"
