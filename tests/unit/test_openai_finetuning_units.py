"""The file checks, the file store, OpenAI's status mapping and model names, and the
resume edge of the state machine (guarded: a paused job only)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from finetune_studio.api.openai_jobs import openai_status, parse_model_name
from finetune_studio.errors import FileNotFound, InvalidFile, InvalidTransition
from finetune_studio.files.checks import check_file
from finetune_studio.files.store import FileStore
from finetune_studio.jobs.service import make_status
from finetune_studio.jobs.store import JobStore


def jsonl(rows: list[Any]) -> str:
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)


def chat(*turns: tuple[str, str], **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": role, "content": text, **extra.get(str(i), {})} for i, (role, text) in enumerate(turns)]}


GOOD = chat(("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello"))
PREFERENCE = {
    "input": {"messages": [{"role": "user", "content": "Hi"}]},
    "preferred_output": [{"role": "assistant", "content": "Hello!"}],
    "non_preferred_output": [{"role": "assistant", "content": "Go away."}],
}


def check(tmp_path: Path, rows: list[Any], purpose: str = "fine-tune", name: str = "f.jsonl") -> Any:
    path = tmp_path / name
    path.write_text(jsonl(rows))
    return check_file(path, purpose, name)


def test_chat_and_preference_files_pass_and_say_their_format(tmp_path: Path) -> None:
    facts = check(tmp_path, [GOOD, GOOD, ""])
    assert (facts.format, facts.rows, facts.weighted) == ("chat", 2, False)
    weighted = chat(("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d"), **{"1": {"weight": 0}})
    assert check(tmp_path, [weighted]).weighted
    assert check(tmp_path, [PREFERENCE]).format == "preference"


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ("{not json", "line 2 is not valid JSON"),
        ([1, 2], "line 2 must be a JSON object, found a list"),
        ({"prompt": "x"}, "line 2 has neither \"messages\""),
        (chat(("user", "Hi"), ("bot", "Hello")), 'line 2 messages[1].role is "bot"'),
        (chat(("user", "Hi")), "line 2 ends with a user message"),
        (chat(("user", "Hi"), ("user", "Again"), ("assistant", "x")), "two user messages in a row"),
        (chat(("assistant", "x"),), "before any user message"),
        (chat(("user", "Hi"), ("assistant", "")), "messages[1].content is empty"),
        (chat(("user", "Hi"), ("assistant", "x"), **{"1": {"weight": 2}}), "messages[1].weight is 2"),
        (chat(("user", "Hi"), ("assistant", "x"), **{"0": {"weight": 1}}), "only assistant messages take one"),
        (chat(("user", "Hi"), ("assistant", "x"), **{"1": {"weight": 0}}), "nothing to train on"),
        ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": []}]}, "tool call"),
        (PREFERENCE, "line 2 is in the preference format but line 1 is in the chat format"),
    ],
)
def test_a_bad_line_is_named_with_its_problem(tmp_path: Path, row: Any, problem: str) -> None:
    with pytest.raises(InvalidFile) as refused:
        check(tmp_path, [GOOD, row])
    assert problem in str(refused.value) and refused.value.param == "file" and refused.value.status_code == 400


def test_many_bad_lines_name_five_and_count_the_rest(tmp_path: Path) -> None:
    with pytest.raises(InvalidFile) as refused:
        check(tmp_path, ["nope"] * 9)
    text = str(refused.value)
    assert "line 5 is not valid JSON" in text and "line 6" not in text and "and 4 more bad lines" in text


def test_empty_and_non_utf8_files_and_unknown_purposes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidFile, match="holds no rows"):
        check(tmp_path, [""])
    (tmp_path / "latin.jsonl").write_bytes(b'{"messages": "caf\xe9"}\n')
    with pytest.raises(InvalidFile, match="line 1 is not UTF-8"):
        check_file(tmp_path / "latin.jsonl", "fine-tune", "latin.jsonl")
    with pytest.raises(InvalidFile, match="purpose 'batch'") as refused:
        check(tmp_path, [GOOD], purpose="batch")
    assert refused.value.param == "purpose"


def test_studio_files_take_any_shape_the_studio_reads(tmp_path: Path) -> None:
    assert check(tmp_path, [{"instruction": "a", "output": "b"}], purpose="studio").format == "jsonl"
    (tmp_path / "d.csv").write_text("question,answer\nhi,hello\n")
    assert check_file(tmp_path / "d.csv", "studio", "d.csv").format == "csv"
    with pytest.raises(InvalidFile, match="the studio reads"):
        check_file(tmp_path / "d.csv", "studio", "d.exe")
    with pytest.raises(InvalidFile, match="not a Parquet file"):
        check_file(tmp_path / "d.csv", "studio", "d.parquet")


def test_the_store_keeps_checked_files_and_pages_them(tmp_path: Path) -> None:
    db = tmp_path / "studio.db"
    JobStore(db).close()  # its migrations make the files table
    files = FileStore(db, tmp_path / "files")
    ids = []
    for rows in ([GOOD], [PREFERENCE], [GOOD, GOOD]):
        ingested = files.ingest(io.BytesIO(jsonl(rows).encode()), "data.jsonl", "fine-tune", max_bytes=10_000)
        ids.append(files.record(ingested).id)
    preference = files.get(ids[1])
    assert json.loads(preference.dpo_path.read_text()) == {
        "prompt": [{"role": "user", "content": "Hi"}],
        "chosen": [{"role": "assistant", "content": "Hello!"}],
        "rejected": [{"role": "assistant", "content": "Go away."}],
    }
    first, more = files.list(limit=2)
    rest, last = files.list(limit=2, after=first[-1].id)
    assert [f.id for f in first + rest] == ids[::-1] and more and not last
    with pytest.raises(InvalidFile, match="over this server's limit of 10 bytes"):
        files.ingest(io.BytesIO(jsonl([GOOD]).encode()), "big.jsonl", "fine-tune", max_bytes=10)
    with pytest.raises(InvalidFile):
        files.ingest(io.BytesIO(b"nope\n"), "bad.jsonl", "fine-tune", max_bytes=10_000)
    files.delete(ids[1])
    assert not preference.path.exists() and not preference.dpo_path.exists()
    with pytest.raises(FileNotFound):
        files.get(ids[1])
    # Nothing but the two stored files is left: refused uploads leave no partial behind.
    assert sorted(p.name for p in (tmp_path / "files").iterdir()) == sorted(files.get(i).path.name for i in (ids[0], ids[2]))


@pytest.mark.parametrize(
    ("phase", "details", "status"),
    [
        ("idle", {}, "queued"),
        ("loading_model", {}, "running"),
        ("configuring", {}, "running"),
        ("training", {}, "running"),
        ("completed", {}, "succeeded"),
        ("error", {}, "failed"),
        ("stopped", {}, "cancelled"),
        ("stopped", {"paused": True}, "paused"),
    ],
)
def test_phases_map_to_openai_statuses(phase: str, details: dict[str, Any], status: str) -> None:
    assert openai_status(phase, details) == status


def test_model_names_read_back() -> None:
    named = parse_model_name("ft:tiny-llama:pirate:0a1b2c")
    assert named is not None and (named.job_id, named.step) == ("0a1b2c", None)
    named = parse_model_name("ft:org/model:::0a1b2c:ckpt-step-12")
    assert named is not None and (named.job_id, named.step) == ("0a1b2c", 12)
    assert parse_model_name("0a1b2c") is None


def test_only_a_paused_job_resumes(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "studio.db")
    for job_id, details in (("paused", {"paused": True}), ("cancelled", {})):
        store.create_job(job_id, {}, str(tmp_path), make_status(job_id, "idle", "Queued"))
        store.set_stop_requested(job_id, pause=bool(details))
        store.transition(job_id, make_status(job_id, "stopped", "Stopped", details=details))
    with pytest.raises(InvalidTransition, match="only a paused job resumes"):
        store.transition("cancelled", make_status("cancelled", "idle", "Resumed"))
    assert store.get_job("paused").pause_requested
    event = store.transition("paused", make_status("paused", "idle", "Resumed"), request={"resume_from_checkpoint": "x"})
    job = store.get_job("paused")
    assert (event.id, job.phase, job.stop_requested, job.pause_requested) == (3, "idle", False, False)
    assert job.request == {"resume_from_checkpoint": "x"}
    assert [e.id for e in store.events_before("paused", None, 10)] == [3, 2, 1]
    assert [e.id for e in store.events_before("paused", 3, 1)] == [2]
