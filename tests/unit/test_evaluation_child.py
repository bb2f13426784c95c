"""The evaluation child against an OpenAI-compatible stand-in whose answers the test controls
(tests/helpers/fake_openai.py): every heldout metric equals a computation by hand with the same
libraries on the same answers, the judge's position swap, tie rule and intervals, the suites'
bad inputs, and a server without /v1/completions.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sacrebleu
from rouge_score import rouge_scorer

from finetune_studio.child.completions import assistant_spans
from finetune_studio.child.datasets.errors import DatasetError
from finetune_studio.child.datasets.load import load_local
from finetune_studio.evaluation.api import PromptLogprobs
from finetune_studio.evaluation.heldout import NO_COMPLETIONS, answer_token_stats
from finetune_studio.evaluation.stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED
from tests.helpers.evaluations import TASK_YAML, eval_request, run_eval_child
from tests.helpers.fake_openai import FakeOpenAI

ROWS = [
    {"messages": [{"role": "user", "content": f"What is {i} plus {i}?"}, {"role": "assistant", "content": f"It is {2 * i}."}]}
    for i in range(5)
] + [
    {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one?"},
        {"role": "assistant", "content": "Green is another colour."},
    ]},
]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def tuned_and_base(model: str, messages: list[dict[str, Any]]) -> str:
    """tuned knows the sums and half of the colours; base answers loosely."""
    last = messages[-1]["content"]
    if "plus" in last:
        number = 2 * int(last.split()[2])
        return f"It is {number}." if model == "tuned" else f"Maybe {number + 1}, it is."
    return "Green is a colour." if model == "tuned" else "Red."


def bootstrap_interval(values: list[float]) -> list[float]:
    """The documented paired bootstrap, written out: 1,000 resamples, the fixed seed, percentiles."""
    draws = np.random.default_rng(BOOTSTRAP_SEED).choice(len(values), size=(BOOTSTRAP_RESAMPLES, len(values)), replace=True)
    stats = np.asarray(values)[draws].mean(axis=1)
    return [float(v) for v in np.percentile(stats, [2.5, 97.5])]


@pytest.mark.slow  # the child loads the tokenizers with transformers: seconds each
def test_heldout_metrics_equal_a_computation_by_hand(tmp_path: Path, tiny_model: Path) -> None:
    data = write_jsonl(tmp_path / "heldout.jsonl", ROWS)
    with FakeOpenAI({"tuned", "base"}, tuned_and_base) as api:
        suites = [{"type": "heldout", "data": [str(data)], "format_type": "auto", "max_new_tokens": 32}]
        run = run_eval_child(tmp_path / "out", eval_request(api.url, ["tuned", "base"], suites, tiny_model))
        chats, completions = list(api.chats), list(api.completions)
    assert run.last["phase"] == "completed", run.last
    assert run.phases[:3] == ["loading_model", "loading_model", "evaluating"]
    models = ["tuned", "base"]

    # The greedy answers: temperature 0, the conversation up to its last answer, max_new_tokens.
    answers: dict[str, dict[str, str]] = {model: {} for model in models}
    for body, text in chats:
        assert body["temperature"] == 0 and body["max_tokens"] == 32
        answers[body["model"]][json.dumps(body["messages"])] = text
    prompts = [json.dumps([{"role": m["role"], "content": m["content"]} for m in row["messages"][:-1]]) for row in ROWS]
    references = [row["messages"][-1]["content"] for row in ROWS]
    hyps = {model: [answers[model][prompt] for prompt in prompts] for model in models}

    scorer = rouge_scorer.RougeScorer(["rougeL"])
    by_hand = {
        "heldout/exact_match": {m: [float(" ".join(h.split()) == " ".join(r.split())) for h, r in zip(hyps[m], references, strict=True)] for m in models},
        "heldout/rouge_l": {m: [scorer.score(r, h)["rougeL"].fmeasure for h, r in zip(hyps[m], references, strict=True)] for m in models},
    }
    for name, values in by_hand.items():
        metric = run.metric(name)
        for model in models:
            assert metric["values"][model] == pytest.approx(sum(values[model]) / len(values[model]), abs=1e-7)
            assert metric["ci95"][model] == pytest.approx(bootstrap_interval(values[model]), abs=1e-7)
        assert metric["deltas"]["base"] == pytest.approx(metric["values"]["base"] - metric["values"]["tuned"], abs=1e-7)
        differences = [b - t for b, t in zip(values["base"], values["tuned"], strict=True)]
        assert metric["deltas_ci95"]["base"] == pytest.approx(bootstrap_interval(differences), abs=1e-7)
        assert metric["higher_is_better"] is True and metric["samples"] == len(ROWS)
    assert run.metric("heldout/bleu")["values"] == {
        m: pytest.approx(sacrebleu.corpus_bleu(hyps[m], [references]).score, abs=1e-6) for m in models
    }
    assert run.metric("heldout/chrf")["values"] == {
        m: pytest.approx(sacrebleu.corpus_chrf(hyps[m], [references]).score, abs=1e-6) for m in models
    }
    for name in ("heldout/bleu", "heldout/chrf"):
        metric = run.metric(name)
        low, high = metric["deltas_ci95"]["base"]
        assert low <= metric["deltas"]["base"] <= high
        assert set(metric["ci95"]) == set(models)

    # Loss, perplexity and token accuracy over the answers' tokens only, from the echoed log-probabilities.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    texts = {assistant_spans(tokenizer, row["messages"])[0]: assistant_spans(tokenizer, row["messages"])[1] for row in ROWS}
    totals = {model: [0.0, 0, 0] for model in models}
    scored = []
    for body, answer in completions:
        if body["prompt"] == "a":
            continue  # the probe: does the route exist
        assert body["echo"] is True and body["logprobs"] == 1 and body["max_tokens"] == 0
        assert isinstance(body["prompt"], list), "a group of rows' loss passes goes in one request"
        for prompt, choice in zip(body["prompt"], answer["choices"], strict=True):
            scored.append((body["model"], prompt))
            spans = texts[prompt]
            logprobs = choice["logprobs"]
            ends = [*logprobs["text_offset"][1:], len(prompt)]
            for lp, top, start, end in zip(logprobs["token_logprobs"], logprobs["top_logprobs"], logprobs["text_offset"], ends,
                                           strict=True):
                if lp is not None and any(a <= start and end <= b for a, b in spans):
                    totals[body["model"]][0] -= lp
                    totals[body["model"]][1] += 1
                    totals[body["model"]][2] += lp >= max(top.values())
    assert sorted(scored) == sorted((model, text) for model in models for text in texts), "each row scored once per model"
    for model in models:
        nll, tokens, correct = totals[model]
        assert tokens > 0
        assert run.metric("heldout/loss")["values"][model] == pytest.approx(nll / tokens, abs=1e-7)
        assert run.metric("heldout/perplexity")["values"][model] == pytest.approx(math.exp(nll / tokens), rel=1e-7)
        assert run.metric("heldout/token_accuracy")["values"][model] == pytest.approx(correct / tokens, abs=1e-7)
    assert run.metric("heldout/loss")["higher_is_better"] is False

    # One per-sample row per row, every model's answer and scores in it.
    samples = run.samples
    assert [row["index"] for row in samples] == list(range(len(ROWS)))
    assert samples[0]["reference"] == "It is 0." and samples[0]["answers"] == {"tuned": "It is 0.", "base": "Maybe 1, it is."}
    assert samples[0]["scores"]["tuned"]["exact_match"] == 1.0 and samples[0]["scores"]["base"]["exact_match"] == 0.0
    assert samples[5]["prompt"].endswith("user: Another one?")
    # Progress counts samples: each model's rows.
    assert run.progress[-1]["step"] == run.progress[-1]["total_steps"] == 2 * len(ROWS)


def test_the_answer_tokens_are_the_ones_inside_the_spans() -> None:
    text = "Q: hi A: yes please"
    logprobs = PromptLogprobs(
        text=text, tokens=["Q:", " hi", " A:", " yes", " please"], token_logprobs=[None, -1.0, -2.0, -0.5, -0.25],
        top_logprobs=[None, {"x": -0.1}, {"x": -0.1}, {"yes": -0.5}, {"x": -0.1}], text_offset=[0, 2, 5, 8, 12],
    )
    assert answer_token_stats(logprobs, text, [(8, len(text))]) == (0.75, 2, 1)
    # A prefix the server added (a BOS token's text) shifts every offset by its length.
    shifted = PromptLogprobs("<s>" + text, ["<s>", *logprobs.tokens], [None, *logprobs.token_logprobs],
                             [None, *logprobs.top_logprobs], [0, *[o + 3 for o in logprobs.text_offset]])
    assert answer_token_stats(shifted, text, [(8, len(text))]) == (0.75, 2, 1)


def judge_rule(model: str, messages: list[dict[str, Any]]) -> str:
    """The stand-in judge: a "good" answer beats one without; a "bad" one loses; "sway" makes it
    always pick A (a position bias), "garble" makes it answer nothing it can parse."""
    if model != "judge":
        raise AssertionError("only the judge is asked here")
    text = messages[-1]["content"]
    a = text.split("[Answer A]\n", 1)[1].split("\n\n[Answer B]\n", 1)[0]
    b = text.split("[Answer B]\n", 1)[1]
    if "garble" in a + b:
        return "I cannot decide between these."
    if "sway" in a + b:
        return json.dumps({"reason": "A came first", "winner": "A"})
    if ("good" in a) != ("good" in b):
        return json.dumps({"reason": "one is good", "winner": "A" if "good" in a else "B"})
    if ("bad" in a) != ("bad" in b):
        return json.dumps({"reason": "one is bad", "winner": "B" if "bad" in a else "A"})
    return 'Both are alike. {"reason": "alike", "winner": "tie"}'


def answers(model: str, messages: list[dict[str, Any]]) -> str:
    index = int(messages[-1]["content"].split()[-1])
    if model == "judge":
        return judge_rule(model, messages)
    if model == "first":
        return f"plain answer {index}"
    if model == "better":
        return f"good answer {index}" if index < 6 else f"plain answer {index}"
    if model == "swayed":
        return f"sway answer {index}"
    return f"garble {index}" if index < 3 else f"bad answer {index}"


def test_the_judge_swaps_positions_ties_disagreements_and_keeps_its_reasons(tmp_path: Path) -> None:
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"Answer question {i}", **({"reference": "ref"} if i == 0 else {})} for i in range(10)])
    models = ["first", "better", "swayed", "worse"]

    def answer(model: str, messages: list[dict[str, Any]]) -> str:
        return judge_rule(model, messages) if model == "judge" else answers(model, messages)

    with FakeOpenAI({*models, "judge"}, answer) as api:
        suites = [{"type": "judge", "prompts": str(prompts), "judge": {"model": "judge"}, "max_new_tokens": 16}]
        run = run_eval_child(tmp_path / "out", eval_request(api.url, models, suites))
        judged = [body for body, _ in api.chats if body["model"] == "judge"]
    assert run.last["phase"] == "completed", run.last
    assert run.phases == ["loading_model", "evaluating", "judging", "completed"]

    # Each pair twice, positions swapped.
    assert len(judged) == 2 * 10 * 3
    pairs = {(body["messages"][1]["content"].split("[Answer A]\n")[1].split("\n\n")[0],
              body["messages"][1]["content"].split("[Answer B]\n")[1]) for body in judged}
    assert ("plain answer 0", "good answer 0") in pairs and ("good answer 0", "plain answer 0") in pairs
    assert "[Reference answer]\nref" in judged[0]["messages"][1]["content"] or any("[Reference answer]" in b["messages"][1]["content"] for b in judged)

    win, tie, loss = run.metric("judge/win_rate"), run.metric("judge/tie_rate"), run.metric("judge/loss_rate")
    assert win["values"] == {"first": None, "better": 0.6, "swayed": 0.0, "worse": 0.0}
    assert tie["values"] == {"first": None, "better": 0.4, "swayed": 1.0, "worse": 0.3}  # a position bias is all ties
    assert loss["values"] == {"first": None, "better": 0.0, "swayed": 0.0, "worse": 0.7}
    assert win["ci95"]["better"] == pytest.approx(bootstrap_interval([1.0] * 6 + [0.0] * 4), abs=1e-7)
    assert loss["ci95"]["worse"] == pytest.approx(bootstrap_interval([0.0] * 3 + [1.0] * 7), abs=1e-7)
    assert win["deltas"] == {} and win["higher_is_better"] is True
    unparsed = run.metric("judge/unparsed")
    assert unparsed["values"] == {"first": None, "better": 0.0, "swayed": 0.0, "worse": 6.0}  # both verdicts of 3 prompts
    assert any("6 of the judge's verdicts could not be parsed" in w for w in run.results["warnings"])

    rows = run.samples
    assert len(rows) == 10 and rows[0]["answers"]["better"] == "good answer 0"
    verdict = rows[0]["verdict"]["better"]
    assert verdict["outcome"] == "win"
    assert [(v["A"], v["B"], v["winner"], v["reason"]) for v in verdict["verdicts"]] == [
        ("first", "better", "B", "one is good"), ("better", "first", "A", "one is good"),
    ]
    swayed = rows[0]["verdict"]["swayed"]
    assert swayed["outcome"] == "tie" and [v["winner"] for v in swayed["verdicts"]] == ["A", "A"]
    garbled = rows[0]["verdict"]["worse"]
    assert garbled["outcome"] == "tie" and [v["parsed"] for v in garbled["verdicts"]] == [False, False]
    assert garbled["verdicts"][0]["reason"] == "I cannot decide between these."
    assert rows[0]["scores"]["better"] == {"win": 1.0, "tie": 0.0, "loss": 0.0}
    # Progress: every answer, then every judged pair.
    assert run.progress[-1]["step"] == run.progress[-1]["total_steps"] == 10 * 4 + 10 * 3


def test_an_external_judge_gets_its_key_and_one_that_cannot_be_reached_fails_saying_so(tmp_path: Path) -> None:
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"Answer question {i}"} for i in range(3)])
    models = ["first", "better"]
    with FakeOpenAI(set(models), answers) as api, FakeOpenAI({"judge"}, judge_rule, token="judge-key-0123456789") as judge:
        suites = [{"type": "judge", "prompts": str(prompts), "judge": {"model": "judge", "base_url": f"{judge.url}/v1"}}]
        run = run_eval_child(tmp_path / "ok", eval_request(api.url, models, suites, judge_keys={"0": "judge-key-0123456789"}))
        assert run.last["phase"] == "completed", run.last
        assert run.metric("judge/win_rate")["values"]["better"] == 1.0
        assert len(judge.chats) == 2 * 3 and not [b for b, _ in api.chats if b["model"] == "judge"]
        wrong = run_eval_child(tmp_path / "wrong", eval_request(api.url, models, suites, judge_keys={"0": "not-the-key"}))
        assert wrong.last["phase"] == "error" and "refused the evaluation's credentials" in wrong.last["error"]
        gone = [{"type": "judge", "prompts": str(prompts), "judge": {"model": "judge", "base_url": "http://127.0.0.1:9/v1"}}]
        run = run_eval_child(tmp_path / "gone", eval_request(api.url, models, gone))
    assert run.last["phase"] == "error"
    assert run.last["details"]["error_code"] == "evaluation_failed"
    assert "the judge at http://127.0.0.1:9/v1 cannot be reached" in run.last["error"]
    assert "judge 'judge'" in run.last["error"]


@pytest.mark.slow  # the child loads the tokenizers with transformers: seconds each
def test_without_v1_completions_heldout_leaves_the_loss_out_and_lm_eval_says_why(tmp_path: Path, tiny_model: Path) -> None:
    data = write_jsonl(tmp_path / "heldout.jsonl", ROWS[:2])
    with FakeOpenAI({"tuned", "base"}, tuned_and_base, completions=False) as api:
        suites = [{"type": "heldout", "data": [str(data)]}]
        run = run_eval_child(tmp_path / "heldout", eval_request(api.url, ["tuned", "base"], suites, tiny_model))
        assert run.last["phase"] == "completed", run.last
        names = {m["name"] for m in run.results["metrics"]}
        assert names == {"heldout/exact_match", "heldout/rouge_l", "heldout/bleu", "heldout/chrf"}
        assert run.results["warnings"] == [f"heldout: {NO_COMPLETIONS}"]
        harness = [{"type": "lm_eval", "tasks": ["arc_easy"]}]
        run = run_eval_child(tmp_path / "lm_eval", eval_request(api.url, ["tuned"], harness, tiny_model))
    assert run.last["phase"] == "error" and run.last["details"]["error_code"] == "evaluation_failed"
    assert "need POST /v1/completions" in run.last["error"]


@pytest.mark.slow  # the child loads the tokenizers with transformers: seconds each
def test_bad_data_a_model_not_served_and_a_stop(tmp_path: Path, tiny_model: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(DatasetError) as loader:
        load_local([str(bad)], "auto")
    with FakeOpenAI({"tuned"}, tuned_and_base) as api:
        run = run_eval_child(tmp_path / "bad", eval_request(api.url, ["tuned"], [{"type": "heldout", "data": [str(bad)]}], tiny_model))
        assert run.phases == ["loading_model", "error"]  # the data is read before anything is asked
        assert run.last["details"]["error_code"] == "dataset_invalid"
        assert run.last["error"] == loader.value.message  # the training loader's words: file and line
        assert "line 2" in run.last["error"]

        data = write_jsonl(tmp_path / "heldout.jsonl", ROWS)
        run = run_eval_child(tmp_path / "gone", eval_request(api.url, ["tuned", "deleted"], [{"type": "heldout", "data": [str(data)]}], tiny_model))
        assert run.last["phase"] == "error" and run.last["details"]["error_code"] == "model_not_found"
        assert "'deleted'" in run.last["error"] and "deleted since the evaluation was queued" in run.last["error"]

        prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"question": "no prompt key"}, {"nothing": 1}])
        run = run_eval_child(tmp_path / "prompts", eval_request(api.url, ["tuned"], [{"type": "judge", "prompts": str(prompts), "judge": {"model": "tuned"}}]))
        assert run.last["details"]["error_code"] == "dataset_invalid" and "line 2" in run.last["error"]

        stopped = run_eval_child(tmp_path / "stop", eval_request(api.url, ["tuned"], [{"type": "heldout", "data": [str(data)]}], tiny_model),
                                 stop_after="Evaluating")
    assert stopped.last["phase"] == "stopped" and stopped.returncode == 0
    assert not (stopped.folder / "results.json").exists()


@pytest.mark.slow  # lm-eval starts (and indexes its tasks) once per model: tens of seconds
def test_lm_eval_runs_a_local_task_folder_through_v1_completions(tmp_path: Path, tiny_model: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    data = write_jsonl(tasks / "tiny_mc.jsonl", [
        {"question": f"What is {i}+{i}?", "choices": [str(2 * i), str(2 * i + 1), "none"], "answer": 0} for i in range(8)
    ])
    (tasks / "tiny_mc.yaml").write_text(TASK_YAML.format(data=data))
    with FakeOpenAI({"tuned", "base"}, token="studio-token-0123456789") as api:
        suites = [{"type": "lm_eval", "tasks": ["tiny_mc"], "tasks_dir": str(tasks), "limit": 6}]
        run = run_eval_child(tmp_path / "out", eval_request(api.url, ["tuned", "base"], suites, tiny_model, token="studio-token-0123456789"))
        asked = [body for body, _ in api.completions if body["prompt"] != "a"]
        missing = run_eval_child(tmp_path / "missing", eval_request(api.url, ["tuned"], [{"type": "lm_eval", "tasks": ["tiny_mcq"], "tasks_dir": str(tasks)}], tiny_model, token="studio-token-0123456789"))
        # A task whose data lives on the hub only: offline, it fails at once, naming the task.
        (tasks / "hub_only.yaml").write_text(TASK_YAML.format(data=data).replace("task: tiny_mc", "task: hub_only").replace(
            "dataset_path: json", "dataset_path: nobody/no-such-dataset").replace(f"    test: {data}\n", "    test: test.jsonl\n"))
        offline = run_eval_child(tmp_path / "offline", eval_request(api.url, ["tuned"], [{"type": "lm_eval", "tasks": ["tiny_mc", "hub_only"], "tasks_dir": str(tasks)}], tiny_model))
    assert run.last["phase"] == "completed", (run.last, run.log[-2000:])
    assert {body["model"] for body in asked} == {"tuned", "base"}
    assert all(body["echo"] and body["logprobs"] == 1 for body in asked)  # lm-eval's own loglikelihood requests
    metric = run.metric("lm_eval/tiny_mc/acc")
    rows = run.samples
    assert len(rows) == 6  # limit passes through
    for model in ("tuned", "base"):
        per_doc = [row["scores"][model]["acc"] for row in rows]
        assert metric["values"][model] == pytest.approx(sum(per_doc) / len(per_doc))  # lm-eval's value, the docs' mean
        assert metric["ci95"][model] == pytest.approx(bootstrap_interval(per_doc), abs=1e-7)
    assert metric["higher_is_better"] is True and metric["samples"] == 6
    assert rows[0]["prompt"].startswith("[tiny_mc #0]") and "Question: What is 0+0?" in rows[0]["prompt"]
    # Progress counts lm-eval's requests: 3 choices per document, per model.
    assert run.progress[-1]["total_steps"] == run.progress[-1]["step"] == 2 * 6 * 3
    assert missing.last["phase"] == "error" and missing.last["details"]["error_code"] == "config_invalid"
    assert "no task 'tiny_mcq'" in missing.last["error"] and "tiny_mc" in missing.last["error"]
    assert offline.last["phase"] == "error" and offline.last["details"]["error_code"] == "dataset_not_found", offline.last
    assert "lm_eval task 'hub_only': its data is not on this machine" in offline.last["error"]
    assert not [p for p in offline.progress if p.get("suite") == "lm_eval" and p["step"]]
