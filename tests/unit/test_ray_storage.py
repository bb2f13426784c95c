"""A Ray job's files at a URI (ray_train/storage.py), against a real S3 endpoint (moto's
server on 127.0.0.1, through pyarrow's own S3 client): what goes up comes down byte for
byte, nothing incomplete is ever taken for complete, the server's paths come back, and
a broken storage says what to check without showing its keys."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyarrow.fs", reason="the storage tests need pyarrow (finetune-studio[ray])")

from finetune_studio.atomic import is_partial  # noqa: E402 - after the skip
from finetune_studio.ray_train import storage  # noqa: E402
from finetune_studio.ray_train.storage import STORED, PathMap, StorageError, Store  # noqa: E402
from tests.helpers.s3 import S3, credentials, s3_server  # noqa: E402


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    with s3_server() as server, credentials():
        yield server


@pytest.fixture
def store(s3: S3, request: pytest.FixtureRequest) -> Store:
    bucket = request.node.name.replace("_", "-")[:50].strip("-").lower()
    s3.make_bucket(bucket)
    return Store(s3.uri(bucket, "studio"))


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_uri_or_folder() -> None:
    from finetune_studio.uris import is_uri, join, redacted

    assert is_uri("s3://bucket/prefix") and is_uri("gs://b") and is_uri("hdfs://host:9000/x")
    for folder in ("/shared/ray", "relative/ray", "file:///shared/ray", "C:\\ray"):
        assert not is_uri(folder), folder
    uri = "s3://b/p?endpoint_override=127.0.0.1:9&scheme=http"
    assert join(uri, "jobs", "j1") == "s3://b/p/jobs/j1?endpoint_override=127.0.0.1:9&scheme=http"
    assert redacted(uri) == "s3://b/p" and redacted("s3://key:hush@b/p") == "s3://b/p"


def test_a_tree_goes_up_and_comes_down_byte_for_byte(store: Store, tmp_path: Path) -> None:
    files = {"a.json": b"{}", "sub/deeper/b.bin": os.urandom(3 * storage.CHUNK // 2), "empty.txt": b""}
    source = write(tmp_path / "source", files)
    assert store.put_tree(source, "x/tree") == 3
    assert store.files("x/tree") == sorted(files)
    store.mark("x/tree")
    assert STORED in store.files("x/tree")
    back = store.get_tree("x/tree", tmp_path / "back")
    assert tree(back) == files  # the marker stays behind
    assert not list(filter(is_partial, tmp_path.iterdir()))
    # replace=False keeps a copy that is already there (another worker on the node fetched it first).
    (back / "a.json").write_bytes(b"kept")
    store.get_tree("x/tree", back, replace=False)
    assert (back / "a.json").read_bytes() == b"kept"
    assert not list(filter(is_partial, tmp_path.iterdir()))
    store.get_tree("x/tree", back)
    assert tree(back) == files
    assert not store.exists("x/none") and store.files("x/none") == []
    with pytest.raises(StorageError, match="holds no files"):
        store.get_tree("x/none", tmp_path / "none")


def test_a_download_that_fails_midway_leaves_nothing(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store.put_tree(write(tmp_path / "source", {"1": b"one", "2": b"two", "3": b"three"}), "t")
    real = Store._download

    def failing(self: Store, rel: str, target: Path) -> None:
        if rel.endswith("/2"):
            target.write_bytes(b"tw")  # half of it, then the connection goes
            raise OSError("connection reset")
        real(self, rel, target)

    monkeypatch.setattr(Store, "_download", failing)
    old = write(tmp_path / "dest", {"old": b"old"})
    with pytest.raises(StorageError, match="connection reset"):
        store.get_tree("t", old)
    assert tree(old) == {"old": b"old"}  # the earlier copy is untouched
    with pytest.raises(StorageError, match="connection reset"):
        store.get_file("t/2", tmp_path / "file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "source"]  # no partial file or folder left


def test_only_marked_checkpoints_count_and_outputs_wait_for_their_marker(store: Store, tmp_path: Path) -> None:
    job = tmp_path / "scratch" / "job1"
    write(job, {"checkpoints/checkpoint-2/trainer_state.json": b"{}", "checkpoints/checkpoint-4/trainer_state.json": b"{}",
                "adapter/adapter_model.safetensors": b"weights", "job.json": b"{}"})
    # Rank 1 uploads its part of checkpoint-4; rank 0 its part of both, but marks only checkpoint-2.
    storage.put_checkpoint_part(store, "job1", job / "checkpoints" / "checkpoint-2")
    storage.put_checkpoint_part(store, "job1", job / "checkpoints" / "checkpoint-4")
    assert store.stored_checkpoints("job1") == []
    store.mark("jobs/job1/checkpoints/checkpoint-2")
    assert store.stored_checkpoints("job1") == [2]

    server = tmp_path / "server" / "job1"
    assert storage.get_outputs(store, "job1", server) == []  # rank 0 has not said the outputs are all there
    storage.put_outputs(store, "job1", job, PathMap([(str(job), str(server))]))
    assert storage.get_outputs(store, "job1", server) == ["adapter", "job.json"]  # never the checkpoints
    assert tree(server) == {"adapter/adapter_model.safetensors": b"weights", "job.json": b"{}\n"}
    storage.get_checkpoint(store, "job1", "checkpoint-2", server)
    assert (server / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file()


def test_the_server_paths_come_back_in_messages_and_job_files(store: Store, tmp_path: Path) -> None:
    scratch, server = tmp_path / "node" / "runs" / "j1-rank0" / "j1", tmp_path / "data" / "jobs" / "j1"
    model_copy, model = tmp_path / "node" / "inputs" / "k" / "tiny", tmp_path / "models" / "tiny"
    paths = PathMap([(str(scratch), str(server)), (str(model_copy), str(model))])
    message: dict[str, Any] = {"details": {"adapter_dir": f"{scratch}/adapter", "output_dir": str(scratch),
                                           "others": [f"{scratch}0/x", "/elsewhere", 3], "model_name": str(model_copy)}}
    assert paths.restore(message) == {"details": {"adapter_dir": f"{server}/adapter", "output_dir": str(server),
                                                  "others": [f"{scratch}0/x", "/elsewhere", 3], "model_name": str(model)}}
    record = {"job_id": "j1", "base_model": {"kind": "folder", "location": str(model_copy)}}
    write(scratch, {"job.json": json.dumps(record).encode(),
                    "adapter/adapter_config.json": json.dumps({"base_model_name_or_path": str(model_copy)}).encode(),
                    "adapter/tokenizer.json": json.dumps({"path": str(model_copy)}).encode()})
    storage.put_outputs(store, "j1", scratch, paths)
    storage.get_outputs(store, "j1", server)
    assert json.loads((server / "job.json").read_text())["base_model"]["location"] == str(model)
    assert json.loads((server / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(model)
    assert json.loads((server / "adapter" / "tokenizer.json").read_text())["path"] == str(model_copy)  # only the files that name the base


def test_inputs_go_up_once_and_each_node_fetches_them_once(store: Store, tmp_path: Path) -> None:
    model = write(tmp_path / "models" / "tiny", {"config.json": b"{}", "model.safetensors": b"w" * 1000})
    data = write(tmp_path / "data", {"train.jsonl": b'{"text": "a"}\n'}) / "train.jsonl"
    jobs = tmp_path / "jobs"
    write(jobs, {"old/checkpoints/checkpoint-3/trainer_state.json": b"{}", "old/checkpoints/checkpoint-7/trainer_state.json": b"{}"})
    request = {"model_name": str(model), "local_datasets": [str(data)], "local_eval_datasets": [],
               "resume_from_checkpoint": "old", "hf_dataset": "not/a/path"}
    assert storage.request_paths(request, jobs) == {str(model): model, str(data): data,
                                                    "old": jobs / "old" / "checkpoints" / "checkpoint-7"}
    placed = storage.upload_inputs(store, request, jobs)
    assert set(placed) == {str(model), str(data), "old"}
    uploaded = store.files("inputs")
    assert storage.upload_inputs(store, request, jobs) == placed and store.files("inputs") == uploaded  # unchanged: not again

    cache = tmp_path / "node"
    local = storage.fetch_inputs(store, placed, cache)
    assert tree(Path(local[str(model)])) == tree(model)
    assert Path(local[str(data)]).read_bytes() == data.read_bytes()
    assert Path(local["old"]).name == "checkpoint-7"
    moved = storage.localize(request, local)
    assert moved["model_name"] == local[str(model)] and moved["local_datasets"] == [local[str(data)]]
    assert moved["resume_from_checkpoint"] == local["old"] and moved["hf_dataset"] == "not/a/path"
    (Path(local[str(model)]) / "config.json").write_bytes(b'{"cached": true}')
    storage.fetch_inputs(store, placed, cache)  # the node's copy is used as it is
    assert (Path(local[str(model)]) / "config.json").read_bytes() == b'{"cached": true}'

    (model / "config.json").write_bytes(b'{"changed": 1}')  # a changed input is a new upload
    again = storage.upload_inputs(store, request, jobs)
    assert again[str(model)] != placed[str(model)] and again[str(data)] == placed[str(data)]


def test_a_storage_that_cannot_be_reached_says_what_to_check(tmp_path: Path) -> None:
    # A port nothing listens on; the key in the query must not be shown.
    uri = "s3://me:hush@bucket/p?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1"
    store = Store(uri)
    with pytest.raises(StorageError) as caught:
        store.put_tree(write(tmp_path, {"f": b"x"}), "x")
    text = str(caught.value)
    assert "s3://bucket/p" in text and "ray_storage_path" in text and "credentials" in text
    assert "hush" not in text
    with pytest.raises(StorageError, match="Could not open"):
        Store("nosuchscheme://bucket/x")


def test_the_driver_copies_stored_checkpoints_and_the_result_before_it_passes_the_end_on(
    store: Store, tmp_path: Path
) -> None:
    """The relay keeps `stored` lines to itself and copies what they name into the job
    folder; the end of the job reaches the server only once the result is here."""
    import io

    from finetune_studio.child.channel import Channel, StopSignal
    from finetune_studio.ray_train.driver import Mirror, Relay

    scratch, folder = tmp_path / "node" / "j1", tmp_path / "data" / "jobs" / "j1"
    write(scratch, {"checkpoints/checkpoint-2/trainer_state.json": b"{}", "adapter/adapter_model.safetensors": b"w"})
    storage.put_checkpoint_part(store, "j1", scratch / "checkpoints" / "checkpoint-2")
    store.mark("jobs/j1/checkpoints/checkpoint-2")

    out = io.StringIO()
    relay = Relay(out, Channel(io.StringIO(), StopSignal()), {}, max_failures=0)
    relay.mirror = Mirror(store, "j1", folder)
    relay.line(1, json.dumps({"type": "stored", "checkpoint": "checkpoint-2"}), sink=None)
    relay.line(1, json.dumps({"type": "stored", "checkpoint": "../../elsewhere"}), sink=None)  # not a checkpoint name: ignored
    relay.mirror.settle()
    assert (folder / "checkpoints" / "checkpoint-2" / "trainer_state.json").is_file()
    assert out.getvalue() == ""  # the server never hears of them

    storage.put_outputs(store, "j1", scratch, PathMap([]))
    end = {"type": "status", "phase": "completed", "message": "done", "details": {"adapter_dir": str(folder / "adapter")}}
    relay.line(1, json.dumps(end), sink=None)
    assert (folder / "adapter" / "adapter_model.safetensors").read_bytes() == b"w"
    relayed = json.loads(out.getvalue())
    assert relayed["phase"] == "completed" and "warnings" not in relayed["details"]

    # A result that cannot be copied: the end still comes, and says where the files are.
    other = Relay(io.StringIO(), Channel(io.StringIO(), StopSignal()), {}, max_failures=0)
    other.mirror = Mirror(store, "j2", tmp_path / "data" / "jobs" / "j2")
    other.mirror.checkpoint("checkpoint-9")  # never stored
    other.line(1, json.dumps({**end, "details": {}}), sink=None)
    said = json.loads(other.events.getvalue())  # type: ignore[attr-defined]
    assert said["phase"] == "completed"
    assert any("checkpoint-9 stays at the job storage only" in w for w in said["details"]["warnings"])
