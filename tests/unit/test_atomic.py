"""The one atomic save (finetune_studio/atomic.py): a reader never sees a partial file under
its final name, even when the writer is killed with SIGKILL between the write and the rename;
a partial is removed on any failure; a folder is replaced whole."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from finetune_studio.atomic import is_partial, partial_path, save_atomically, write_atomically, write_file

# A child that writes SIZE bytes of "n" to FINAL through the helper, says so, and waits
# inside the block (between the write and the rename) for a line on stdin.
BLOCKED_WRITER = """
import sys
from pathlib import Path
from finetune_studio.atomic import write_atomically
final, size = Path(sys.argv[1]), int(sys.argv[2])
with write_atomically(final) as partial:
    with open(partial, "wb") as handle:
        for _ in range(size // (1 << 20)):
            handle.write(b"n" * (1 << 20))
    print("written", flush=True)
    sys.stdin.readline()
print("renamed", flush=True)
"""

# A child that rewrites FINAL through write_file, version after version, until it is killed.
# Version n: a header that says its number and length, then that many bytes, then a footer.
LOOPING_WRITER = """
import sys
from pathlib import Path
from finetune_studio.atomic import write_file
final = Path(sys.argv[1])
n = 0
while True:
    n += 1
    size = (1 << 18) * (1 + n % 8)
    write_file(final, b"%d:%d:" % (n, size) + bytes([n % 251]) * size + b":end")
    if n == 2:
        print("looping", flush=True)
"""


def version_problem(data: bytes) -> str | None:
    """What is wrong with a version LOOPING_WRITER wrote (None: it is whole)."""
    try:
        number, size, rest = data.split(b":", 2)
        n, length = int(number), int(size)
    except ValueError:
        return f"no header in {data[:40]!r} ({len(data)} bytes)"
    if rest != bytes([n % 251]) * length + b":end":
        return f"version {n} has {len(rest)} bytes after its header, not {length + 4} as written"
    return None


def start(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


class Reader:
    """Reads `final` over and over in a thread, keeping what was wrong with any read."""

    def __init__(self, final: Path, check: Callable[[bytes], str | None]) -> None:
        self.final, self.check = final, check
        self.reads = 0
        self.seen: set[bytes] = set()  # the versions' headers
        self.problems: list[str] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.done.is_set():
            try:
                data = self.final.read_bytes()
            except FileNotFoundError:
                self.problems.append("the final name was missing")
                continue
            self.reads += 1
            problem = self.check(data)
            if problem:
                self.problems.append(problem)
            self.seen.add(data[:16])


@pytest.fixture
def reading() -> Iterator[list[Reader]]:
    readers: list[Reader] = []
    yield readers
    for reader in readers:
        reader.done.set()
        reader.thread.join(timeout=10)


def test_a_writer_killed_between_the_write_and_the_rename_leaves_the_old_file_whole(
    tmp_path: Path, reading: list[Reader]
) -> None:
    final = tmp_path / "job.json"
    old = b"o" * (1 << 20)
    final.write_bytes(old)
    size = 16 << 20
    reader = Reader(final, lambda data: None if data == old else f"read {len(data)} bytes that are not the old file")
    reading.append(reader)
    reader.thread.start()

    partial = partial_path(final)
    with start(BLOCKED_WRITER, str(final), str(size)) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "written"
        assert partial.stat().st_size == size  # the new content is whole, under its partial name only
        assert final.read_bytes() == old
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=10) == -signal.SIGKILL
    reader.done.set()
    reader.thread.join(timeout=10)

    assert reader.reads > 0 and reader.problems == []
    assert final.read_bytes() == old
    assert is_partial(partial) and partial.exists()  # what a sweep removes: the readers skip it

    # The same child, let go: the rename follows, and the new content is all there.
    with start(BLOCKED_WRITER, str(final), str(size)) as child:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "written"
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "renamed" and child.wait(timeout=10) == 0
    assert final.stat().st_size == size and final.read_bytes()[:4] == b"nnnn"
    assert not partial.exists()


def test_a_writer_killed_at_a_random_moment_never_shows_a_reader_part_of_a_file(
    tmp_path: Path, reading: list[Reader]
) -> None:
    final = tmp_path / "model.gguf"
    write_file(final, b"0:0::end")
    rounds = 4
    reader = Reader(final, version_problem)
    reading.append(reader)
    reader.thread.start()
    for _ in range(rounds):
        with start(LOOPING_WRITER, str(final)) as child:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "looping"
            time.sleep(random.uniform(0.01, 0.3))
            os.kill(child.pid, signal.SIGKILL)
            assert child.wait(timeout=10) == -signal.SIGKILL
        assert version_problem(final.read_bytes()) is None
    reader.done.set()
    reader.thread.join(timeout=10)
    assert reader.problems == []
    assert reader.reads > rounds and len(reader.seen) >= 2  # it read while versions replaced each other
    assert [p.name for p in tmp_path.iterdir() if not is_partial(p)] == ["model.gguf"]


def test_the_partial_name_is_one_rule() -> None:
    final = Path("/data/exports/e1/model-q8_0.gguf")
    assert partial_path(final) == final.with_name(".model-q8_0.gguf.partial")
    first, second = partial_path(final, unique=True), partial_path(final, unique=True)
    assert first != second and first.parent == final.parent
    for path in (partial_path(final), first, Path(".work.partial")):
        assert is_partial(path) and is_partial(path.name)
    for name in ("model.gguf", "model.partial", ".partial", ".model.gguf", "checkpoint-3"):
        assert not is_partial(name), name


@pytest.mark.parametrize("failure", [RuntimeError("disk full"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
def test_a_failed_write_leaves_no_partial_and_the_old_file(tmp_path: Path, failure: BaseException) -> None:
    final = tmp_path / "Modelfile"
    final.write_text("old")
    with pytest.raises(type(failure)), write_atomically(final) as partial:
        partial.write_text("half of the new")
        raise failure
    assert final.read_text() == "old" and list(tmp_path.iterdir()) == [final]

    with pytest.raises(FileNotFoundError, match="was not written"), write_atomically(final):
        pass  # a tool that wrote nothing
    assert final.read_text() == "old" and list(tmp_path.iterdir()) == [final]

    partial_path(final).write_text("left by a process killed mid-write")
    write_file(final, "new")
    assert final.read_text() == "new" and list(tmp_path.iterdir()) == [final]
    write_file(tmp_path / "deeper" / "job.json", b"{}")  # its folder is made
    assert (tmp_path / "deeper" / "job.json").read_bytes() == b"{}"


def test_a_resumable_download_keeps_its_partial_for_the_next_try(tmp_path: Path) -> None:
    final = tmp_path / "model.gguf"
    with pytest.raises(ConnectionError), write_atomically(final, resume=True) as partial:
        partial.write_bytes(b"first half ")
        raise ConnectionError("the download broke off")
    assert not final.exists() and partial_path(final).read_bytes() == b"first half "
    with write_atomically(final, resume=True) as partial:
        with open(partial, "ab") as handle:
            handle.write(b"and the rest")
    assert final.read_bytes() == b"first half and the rest" and list(tmp_path.iterdir()) == [final]


def test_a_folder_is_built_aside_and_replaces_the_old_one_whole(tmp_path: Path) -> None:
    final = tmp_path / "adapter"
    with save_atomically(final) as partial:
        assert partial == partial_path(final) and partial.is_dir() and not any(partial.iterdir())
        (partial / "adapter_model.safetensors").write_bytes(b"weights 1")
        (partial / "sub").mkdir()
        (partial / "sub" / "tokenizer.json").write_text("{}")
    assert sorted(p.relative_to(final).as_posix() for p in final.rglob("*")) == [
        "adapter_model.safetensors", "sub", "sub/tokenizer.json"
    ]
    assert list(tmp_path.iterdir()) == [final]

    # A failure (Ctrl-C included) leaves the old folder as it was, and no partial.
    for failure in (RuntimeError("out of memory"), KeyboardInterrupt()):
        with pytest.raises(type(failure)), save_atomically(final) as partial:
            (partial / "adapter_model.safetensors").write_bytes(b"half")
            raise failure
        assert (final / "adapter_model.safetensors").read_bytes() == b"weights 1"
        assert list(tmp_path.iterdir()) == [final]

    # A stale partial of a killed run is not built upon: the block gets an empty folder.
    partial_path(final).mkdir()
    (partial_path(final) / "stale").write_text("x")
    with save_atomically(final) as partial:
        assert not any(partial.iterdir())
        (partial / "adapter_model.safetensors").write_bytes(b"weights 2")
    assert [p.name for p in final.iterdir()] == ["adapter_model.safetensors"]  # nothing of the old one is left
    assert (final / "adapter_model.safetensors").read_bytes() == b"weights 2"
    assert list(tmp_path.iterdir()) == [final]

    # replace=False: a folder already there (another process's copy) is kept; this one is dropped.
    with save_atomically(final, unique=True, replace=False) as partial:
        (partial / "adapter_model.safetensors").write_bytes(b"weights 3")
    assert (final / "adapter_model.safetensors").read_bytes() == b"weights 2"
    assert list(tmp_path.iterdir()) == [final]
    fresh = tmp_path / "checkpoint-3"
    with save_atomically(fresh, unique=True, replace=False) as partial:
        (partial / "trainer_state.json").write_text("{}")
    assert (fresh / "trainer_state.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "checkpoint-3"]


@pytest.mark.parametrize("flush", [True, False])
def test_a_work_file_is_renamed_into_place_and_flushed_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flush: bool
) -> None:
    # flush=False (an export's merged folder and 16-bit intermediate, removed after): the same
    # rename, the same cleanup on failure, but no fsync of the data or of the folder.
    from finetune_studio import atomic

    flushed: list[Path] = []
    monkeypatch.setattr(atomic, "_fsync", lambda path: flushed.append(Path(path)))
    with write_atomically(tmp_path / "model-f16.gguf", flush=flush) as partial:
        partial.write_bytes(b"gguf")
    with save_atomically(tmp_path / "merged", flush=flush) as folder:
        (folder / "model.safetensors").write_bytes(b"weights")
    assert (tmp_path / "model-f16.gguf").read_bytes() == b"gguf"
    assert (tmp_path / "merged" / "model.safetensors").read_bytes() == b"weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged", "model-f16.gguf"]
    assert bool(flushed) is flush
    with pytest.raises(RuntimeError), write_atomically(tmp_path / "model-f16.gguf", flush=flush) as partial:
        partial.write_bytes(b"half")
        raise RuntimeError("killed")
    assert (tmp_path / "model-f16.gguf").read_bytes() == b"gguf" and not any(map(is_partial, tmp_path.iterdir()))
