"""The evaluation's small parts, without a child or a server: the bootstrap, the judge's verdicts,
the phase table, the store's results, the request's rules, and the CLI's request and table."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from rich.console import Console

from finetune_studio.cli.client import StudioError
from finetune_studio.cli.eval_job import eval_request, results_table
from finetune_studio.cli.main import build_parser
from finetune_studio.evaluation.judge import Verdict, outcome, parse_verdict
from finetune_studio.evaluation.stats import BOOTSTRAP_SEED, corpus_bootstrap, paired_bootstrap, resample_indices
from finetune_studio.jobs.phases import can_enter
from finetune_studio.jobs.store import JobStore
from finetune_studio.schemas import EvalStartRequest, TrainingStartRequest, suite_names


def test_the_paired_bootstrap_is_seeded_shared_and_paired() -> None:
    first, second = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    estimate = paired_bootstrap({"a": first, "b": second}, ["a", "b"])
    again = paired_bootstrap({"a": first, "b": second}, ["a", "b"])
    assert estimate == again  # a fixed seed: the same intervals every time
    draws = np.random.default_rng(BOOTSTRAP_SEED).choice(6, size=(1000, 6), replace=True)
    assert (resample_indices(6) == draws).all()
    diffs = (np.asarray(second)[draws] - np.asarray(first)[draws]).mean(axis=1)
    assert estimate.deltas == {"b": pytest.approx(-1 / 3)}
    assert estimate.deltas_ci95["b"] == pytest.approx(list(np.percentile(diffs, [2.5, 97.5])))
    # A ratio of sums (a loss over tokens) and a transform of it (a perplexity).
    nll, tokens = {"a": [2.0, 4.0], "b": [1.0, 1.0]}, {"a": [1.0, 3.0], "b": [1.0, 1.0]}
    loss = paired_bootstrap(nll, ["a", "b"], tokens)
    assert loss.values == {"a": 1.5, "b": 1.0}
    ppl = paired_bootstrap(nll, ["a", "b"], tokens, transform=np.exp)
    assert ppl.values["a"] == pytest.approx(math.exp(1.5)) and ppl.deltas["b"] == pytest.approx(math.e - math.exp(1.5))
    # A model with no value (the judge's first) has none, and no difference is taken from it.
    rates = paired_bootstrap({"b": [1.0, 0.0]}, ["a", "b"])
    assert rates.values == {"a": None, "b": 0.5} and rates.deltas == {}
    assert paired_bootstrap({"a": []}, ["a"]).values == {"a": None}


def test_corpus_bleu_and_chrf_are_sacrebleus_with_their_intervals() -> None:
    import sacrebleu

    refs = ["the cat sat on the mat", "a dog barks at night", "rain falls on the hills"]
    hyps = {"a": ["the cat sat on a mat", "a dog barks at night", "rain falls"], "b": ["cat", "dogs bark", "rain falls on hills"]}
    found = corpus_bootstrap(hyps, refs, ["a", "b"])
    for model in ("a", "b"):
        assert found["bleu"].values[model] == pytest.approx(sacrebleu.corpus_bleu(hyps[model], [refs]).score)
        assert found["chrf"].values[model] == pytest.approx(sacrebleu.corpus_chrf(hyps[model], [refs]).score)
        low, high = found["chrf"].ci95[model]
        assert low <= high
    assert found["bleu"].deltas["b"] == pytest.approx(found["bleu"].values["b"] - found["bleu"].values["a"])
    assert len(found["chrf"].deltas_ci95["b"]) == 2


@pytest.mark.parametrize(
    ("text", "winner"),
    [
        ('{"reason": "clearer", "winner": "B"}', "B"),
        ('Thinking... {"winner": "a", "reason": "x"} done', "A"),
        ('{"reason": "same", "winner": "tie"}', "tie"),
        ("My verdict: [[B]]", "B"),
        ("[[C]]", "tie"),
        ("Winner: A", "A"),
        ("I like both.", None),
        ('{"reason": "?", "winner": "both"}', None),
    ],
)
def test_a_verdict_is_parsed_or_counts_as_a_tie(text: str, winner: str) -> None:
    assert parse_verdict(text).winner == winner


def test_both_verdicts_must_agree_for_a_win_or_a_loss() -> None:
    a, b, tie, none = Verdict("A", ""), Verdict("B", ""), Verdict("tie", ""), Verdict(None, "")
    assert outcome(b, a) == "win"  # the compared model is B first, then A: picked both times
    assert outcome(a, b) == "loss"
    assert outcome(a, a) == "tie"  # a position bias: a disagreement
    assert outcome(b, tie) == "tie" and outcome(none, a) == "tie" and outcome(tie, tie) == "tie"


def test_the_evaluation_phase_table() -> None:
    path = ["idle", "loading_model", "loading_model", "evaluating", "evaluating", "judging", "judging", "completed"]
    assert all(can_enter(target, current, "eval") for current, target in zip(path, path[1:], strict=False))
    assert can_enter("completed", "evaluating", "eval")
    assert not can_enter("evaluating", "judging", "eval") and not can_enter("completed", "loading_model", "eval")
    assert not can_enter("idle", "stopped", "eval")  # no resume
    for phase in ("idle", "loading_model", "evaluating", "judging"):
        assert can_enter("error", phase, "eval") and can_enter("stopped", phase, "eval")


def test_the_store_keeps_results_and_pages_samples(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "studio.db")
    rows = [{"suite": "heldout" if i < 3 else "judge", "index": i % 3, "prompt": f"p{i}"} for i in range(5)]
    assert store.save_eval_results("e1", {"models": ["a"], "metrics": []}, rows) == 5
    assert store.eval_results("e1") == {"models": ["a"], "metrics": []}
    page, total = store.eval_samples("e1", "judge", 0, 10)
    assert total == 2 and [row["prompt"] for row in page] == ["p3", "p4"]
    page, total = store.eval_samples("e1", None, 1, 2)
    assert total == 5 and [row["prompt"] for row in page] == ["p1", "p2"]
    store.save_eval_results("e1", {"models": ["b"], "metrics": []}, rows[:1])  # kept again: replaced
    assert store.eval_samples("e1")[1] == 1 and store.eval_results("e1") == {"models": ["b"], "metrics": []}
    assert store.eval_results("nothing") is None
    store.close()
    again = JobStore(tmp_path / "studio.db")  # migrated once: the tables are there after a restart
    assert again.eval_results("e1") == {"models": ["b"], "metrics": []}
    again.close()


def test_the_request_rules() -> None:
    assert suite_names(["heldout", "judge", "heldout", "heldout"]) == ["heldout", "judge", "heldout_2", "heldout_3"]
    request = EvalStartRequest.model_validate({"models": ["j", "base:j"], "suites": [{"type": "lm_eval", "tasks": ["arc_easy"], "limit": 0.5}]})
    assert request.suite_names() == ["lm_eval"]
    for bad in (
        {"models": ["j"], "suites": [{"type": "heldout", "data": []}]},
        {"models": ["j"], "suites": [{"type": "judge", "prompts": "p.jsonl", "judge": {"model": "m", "api_key_env": "not a name"}}]},
        {"models": ["j"], "suites": [{"type": "nope"}]},
        {"models": ["j"] * 2, "suites": [{"type": "heldout", "data": ["d"]}]},
        {"models": [f"m{i}" for i in range(9)], "suites": [{"type": "heldout", "data": ["d"]}]},
    ):
        with pytest.raises(ValidationError):
            EvalStartRequest.model_validate(bad)
    base = {"model_name": "m", "training_type": "LoRA/QLoRA", "format_type": "auto", "local_datasets": ["d.jsonl"]}
    plain = TrainingStartRequest.model_validate(base)
    assert plain.eval_after == [] and plain.eval_guard is None
    guarded = TrainingStartRequest.model_validate(
        {**base, "eval_after": [{"type": "heldout", "data": ["h.jsonl"]}, {"type": "heldout", "data": ["i.jsonl"]}],
         "eval_guard": {"metric": "heldout_2/rouge_l", "max_drop": 0.05}}
    )
    assert guarded.redacted()["eval_guard"] == {"metric": "heldout_2/rouge_l", "max_drop": 0.05}
    with pytest.raises(ValidationError, match="eval_guard reads the results of eval_after"):
        TrainingStartRequest.model_validate({**base, "eval_guard": {"metric": "heldout/loss", "max_drop": 0.1}})


def test_the_cli_flags_make_the_request(tmp_path: Path) -> None:
    parse = build_parser().parse_args
    args = parse(["eval", "J", "--data", "h.jsonl", "--task", "arc_easy", "--task", "hellaswag", "--num-fewshot", "5",
                  "--limit", "50", "--judge", "gpt", "--judge-prompts", "p.jsonl", "--judge-url", "https://x/v1",
                  "--judge-key-env", "OPENAI_API_KEY", "--against", "base", "--against", "K"])
    body = eval_request(args)
    assert body["models"] == ["J", "base:J", "K"]
    heldout, harness, judge = body["suites"]
    assert heldout == {"type": "heldout", "data": [str(Path("h.jsonl").resolve())], "format_type": "auto", "limit": 50}
    assert harness == {"type": "lm_eval", "tasks": ["arc_easy", "hellaswag"], "num_fewshot": 5, "limit": 50.0}
    assert judge["judge"] == {"model": "gpt", "base_url": "https://x/v1", "api_key_env": "OPENAI_API_KEY"}
    assert eval_request(parse(["eval", "J", "--data", "h.jsonl", "--against", "none"]))["models"] == ["J"]
    with pytest.raises(StudioError, match="name what to evaluate on"):
        eval_request(parse(["eval", "J"]))
    with pytest.raises(StudioError, match="both --judge MODEL and --judge-prompts"):
        eval_request(parse(["eval", "J", "--judge", "gpt"]))


def test_the_results_table() -> None:
    results = {
        "eval_id": "e1",
        "models": ["J", "base:J"],
        "metrics": [
            {"name": "heldout/loss", "values": {"J": 1.25, "base:J": 1.5}, "ci95": {"J": [1.0, 1.5], "base:J": [1.2, 1.8]},
             "deltas": {"base:J": 0.25}, "deltas_ci95": {"base:J": [0.1, 0.4]}, "higher_is_better": False},
            {"name": "judge/win_rate", "values": {"J": None, "base:J": 0.2}, "ci95": {"base:J": [0.0, 0.4]}, "deltas": {},
             "deltas_ci95": {}, "higher_is_better": True},
        ],
    }
    out = io.StringIO()
    Console(file=out, width=160).print(results_table(results))
    text = out.getvalue()
    assert "heldout/loss ↓" in text and "1.25 [1, 1.5]" in text and "+0.25 [0.1, 0.4]" in text
    assert "judge/win_rate ↑" in text and "base:J - J" in text


def test_the_server_never_loads_the_evaluation_libraries_and_the_child_no_web_framework() -> None:
    from tests.helpers.imports import HEAVY, SERVER_SIDE, WEB, loaded_by

    scoring = ("rouge_score", "sacrebleu", "lm_eval")
    assert loaded_by(SERVER_SIDE, scoring) == []
    assert "finetune_studio.api.routes.evaluation" in SERVER_SIDE and "finetune_studio.cli.eval_job" in SERVER_SIDE
    # The child starts light: its scores' libraries load when a suite needs them, lm-eval in a process of its own.
    assert loaded_by(["finetune_studio.evaluation.child"], WEB + HEAVY + scoring) == []
