"""A Ray job's files at a URI, for clusters whose nodes share no folder (docs/SCALE-OUT.md, section 5).

When `ray_storage_path` is a URI that pyarrow understands (s3://, gs://, hdfs://,
abfs://), a Ray job's files travel through it instead of a shared data directory:

    <uri>/inputs/<key>/.../         a local model, dataset or checkpoint the request names,
                                    uploaded once by the driver (`<key>` names its content)
    <uri>/jobs/<id>/checkpoints/checkpoint-N/
                                    every rank uploads the part of a checkpoint it wrote;
                                    rank 0 adds STORED once all the parts are there
    <uri>/jobs/<id>/adapter/, model/, tensorboard/, job.json
                                    rank 0's outputs, uploaded before it reports the end
    <uri>/jobs/<id>/STORED          ... and their marker, written last
    <uri>/ray/<id>/                 Ray Train's own run state

A marker written last is what makes a folder complete: object stores have no atomic
rename, so a reader ignores a folder without one. Downloads land in a partial file or
folder renamed into place (`atomic`), so a local copy too is complete or absent.

The driver runs on the server's machine and copies (`mirror`) each stored checkpoint
and then the outputs into the job's folder there: chat, export and
resume_from_checkpoint find a cluster job's files where they find a local job's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from finetune_studio.atomic import save_atomically, write_atomically
from finetune_studio.uris import join, redacted
from finetune_studio.wire import checkpoint_step

# The marker of a complete folder (written last, never copied down).
STORED = ".finetune-studio-stored"
CHUNK = 8 << 20


class StorageError(Exception):
    """Reading or writing the storage failed; the message says where and what to check."""


@dataclass
class Store:
    """The storage at `uri`, through pyarrow's filesystem for it."""

    uri: str

    def __post_init__(self) -> None:
        from pyarrow import fs as pafs

        try:
            self._fs, self._root = pafs.FileSystem.from_uri(self.uri)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...
            raise StorageError(self.problem("open", exc)) from exc
        self._root = self._root.rstrip("/")

    def problem(self, doing: str, exc: BaseException) -> str:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (f"Could not {doing} the job storage {redacted(self.uri)} ({text}). Check ray_storage_path"
                " and that the server's machine and every node have credentials for it (docs/SCALE-OUT.md, section 5).")

    def path(self, rel: str) -> str:
        return "/".join([self._root, rel.strip("/")]) if rel.strip("/") else self._root

    # -- reading ----------------------------------------------------------

    def exists(self, rel: str) -> bool:
        from pyarrow import fs as pafs

        try:
            return bool(self._fs.get_file_info(self.path(rel)).type != pafs.FileType.NotFound)
        except OSError as exc:
            raise StorageError(self.problem("read", exc)) from exc

    def files(self, rel: str) -> list[str]:
        """The files under `rel`, as paths relative to it ([] when there is none)."""
        from pyarrow import fs as pafs

        base = self.path(rel)
        try:
            infos = self._fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        except OSError as exc:
            raise StorageError(self.problem("list", exc)) from exc
        return sorted(info.path[len(base):].lstrip("/") for info in infos if info.type == pafs.FileType.File)

    def stored_checkpoints(self, job_id: str) -> list[int]:
        """The steps of the job's complete checkpoints, lowest first."""
        steps = set()
        for name in self.files(f"jobs/{job_id}/checkpoints"):
            folder, _, rest = name.partition("/")
            step = checkpoint_step(folder)
            if rest == STORED and step is not None:
                steps.add(step)
        return sorted(steps)

    def get_tree(self, rel: str, dest: Path, replace: bool = True) -> Path:
        """Copy the folder `rel` to `dest`, complete or not at all (the marker stays behind).
        `replace`: a `dest` already there is replaced; otherwise it is kept (another process
        on this node fetched the same content first) and this copy is dropped."""
        names = [name for name in self.files(rel) if name != STORED]
        if not names:
            raise StorageError(f"{join(redacted(self.uri), rel)} holds no files")
        try:
            with save_atomically(dest, unique=True, replace=replace) as partial:
                for name in names:
                    target = partial / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    self._download(f"{rel}/{name}", target)
        except OSError as exc:
            raise StorageError(self.problem("read", exc)) from exc
        return dest

    def get_file(self, rel: str, dest: Path) -> Path:
        """Copy the file `rel` to `dest`, complete or not at all."""
        try:
            with write_atomically(dest, unique=True) as partial:
                self._download(rel, partial)
        except OSError as exc:
            raise StorageError(self.problem("read", exc)) from exc
        return dest

    def _download(self, rel: str, target: Path) -> None:
        with self._fs.open_input_stream(self.path(rel)) as source, open(target, "wb") as out:
            shutil.copyfileobj(source, out, CHUNK)

    # -- writing ----------------------------------------------------------

    def put_file(self, local: Path, rel: str, rewrite: Optional[Callable[[bytes], bytes]] = None) -> None:
        try:
            self._fs.create_dir(self.path(rel.rpartition("/")[0]), recursive=True)
            with self._fs.open_output_stream(self.path(rel)) as out:
                if rewrite is not None:
                    out.write(rewrite(local.read_bytes()))
                else:
                    with open(local, "rb") as source:
                        shutil.copyfileobj(source, out, CHUNK)
        except OSError as exc:
            raise StorageError(self.problem("write", exc)) from exc

    def put_tree(self, local: Path, rel: str, skip: Callable[[Path], bool] = lambda path: False,
                 rewrite: Optional[Callable[[Path], Optional[Callable[[bytes], bytes]]]] = None) -> int:
        """Upload every file under `local` (a file or a folder) to `rel`; the number of files."""
        count = 0
        for path, name in walk(local):
            if skip(path):
                continue
            self.put_file(path, f"{rel}/{name}" if name else rel, rewrite(path) if rewrite else None)
            count += 1
        return count

    def mark(self, rel: str) -> None:
        """Say that the folder `rel` is complete."""
        try:
            self._fs.create_dir(self.path(rel), recursive=True)
            with self._fs.open_output_stream(self.path(f"{rel}/{STORED}")) as out:
                out.write(b"ok\n")
        except OSError as exc:
            raise StorageError(self.problem("write", exc)) from exc


def walk(local: Path) -> Iterator[tuple[Path, str]]:
    """(file, its path relative to `local`) for a folder's files; ('', itself) for a file."""
    if local.is_file():
        yield local, ""
        return
    for root, dirs, files in os.walk(local):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            yield path, path.relative_to(local).as_posix()


def content_key(local: Path) -> str:
    """A name for a local file or folder as it is now: its real path, and each file's size and
    modification time. An unchanged input is uploaded once however many jobs name it."""
    digest = hashlib.sha256(str(local.resolve()).encode())
    for path, name in walk(local):
        stat = path.stat()
        digest.update(f"\0{name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:24]


# -- inputs: what the request names on the server's machine ------------------

# The request fields that may name files on the server's machine, each a path or a list of them.
PATH_FIELDS = ("model_local_path", "model_name", "local_datasets", "local_eval_datasets", "resume_from_checkpoint")


def request_paths(request: dict[str, Any], jobs_dir: Path) -> dict[str, Path]:
    """{what the request says: the local file or folder it names} for every input that is a
    path on this machine. A job id in resume_from_checkpoint names that job's last checkpoint."""
    from finetune_studio.wire import last_checkpoint

    found: dict[str, Path] = {}
    for name in PATH_FIELDS:
        value = request.get(name)
        for text in value if isinstance(value, list) else [value]:
            if not isinstance(text, str) or not text:
                continue
            path = Path(text).expanduser()
            if name == "resume_from_checkpoint":
                if not path.exists() and "/" not in text:
                    path = jobs_dir / text
                if path.is_dir() and not (path / "trainer_state.json").is_file():
                    path = last_checkpoint(path) or path
            if path.exists():
                found[text] = path
    return found


def localize(request: dict[str, Any], local: dict[str, str]) -> dict[str, Any]:
    """The request with each path in `local` ({what it said: the node's copy}) replaced."""
    result = dict(request)
    for name in PATH_FIELDS:
        value = result.get(name)
        if isinstance(value, list):
            result[name] = [local.get(item, item) if isinstance(item, str) else item for item in value]
        elif isinstance(value, str):
            result[name] = local.get(value, value)
    return result


@dataclass
class PathMap:
    """Paths a worker uses (its scratch folder, its copies of the inputs) and the server's
    words for them: what rank 0 reports and what job.json records name the server's paths."""

    pairs: list[tuple[str, str]]

    def __post_init__(self) -> None:
        self.pairs = sorted(self.pairs, key=lambda pair: len(pair[0]), reverse=True)  # the deepest path first

    def restore(self, value: Any) -> Any:
        if isinstance(value, str):
            for local, server in self.pairs:
                if value == local or value.startswith(local.rstrip("/") + "/"):
                    return server + value[len(local):]
            return value
        if isinstance(value, dict):
            return {key: self.restore(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.restore(item) for item in value]
        return value


# -- what the driver and the workers move ----------------------------------------


def upload_inputs(store: Store, request: dict[str, Any], jobs_dir: Path) -> dict[str, str]:
    """Upload each local input the request names that the storage lacks; {what the request
    says: where its copy is (inputs/<key>/<name>)}."""
    placed: dict[str, str] = {}
    for text, path in request_paths(request, jobs_dir).items():
        rel = f"inputs/{content_key(path)}"
        if not store.exists(f"{rel}/{STORED}"):
            store.put_tree(path, f"{rel}/{path.name}")
            store.mark(rel)
        placed[text] = f"{rel}/{path.name}"
    return placed


def fetch_inputs(store: Store, placed: dict[str, str], cache: Path) -> dict[str, str]:
    """Copy each uploaded input to this node's cache (once per node, whichever worker comes
    first); {what the request says: the node's copy}."""
    local: dict[str, str] = {}
    for text, rel in placed.items():
        folder_rel, _, name = rel.rpartition("/")
        folder = cache / "inputs" / folder_rel.rpartition("/")[2]
        if not folder.is_dir():
            store.get_tree(folder_rel, folder, replace=False)
        local[text] = str(folder / name)
    return local


def json_rewriter(paths: PathMap) -> Callable[[Path], Optional[Callable[[bytes], bytes]]]:
    """For put_tree: the JSON files that name paths (job.json's base model, the adapter's
    base) get the server's paths in place of the node's."""
    def rewrite(data: bytes) -> bytes:
        return (json.dumps(paths.restore(json.loads(data)), indent=2) + "\n").encode()

    return lambda path: rewrite if path.name in ("job.json", "adapter_config.json") else None


def put_checkpoint_part(store: Store, job_id: str, checkpoint: Path) -> None:
    """Upload what this worker wrote of a checkpoint (each rank its own files)."""
    store.put_tree(checkpoint, f"jobs/{job_id}/checkpoints/{checkpoint.name}")


def put_outputs(store: Store, job_id: str, folder: Path, paths: PathMap) -> None:
    """Upload rank 0's results (all but the checkpoints, which went up as they were saved), then their marker."""
    def skip(path: Path) -> bool:
        return path.relative_to(folder).parts[0] == "checkpoints"

    if folder.is_dir():
        store.put_tree(folder, f"jobs/{job_id}", skip=skip, rewrite=json_rewriter(paths))
    store.mark(f"jobs/{job_id}")


def get_checkpoint(store: Store, job_id: str, name: str, folder: Path) -> Path:
    """Copy a stored checkpoint of the job into `folder`/checkpoints/."""
    return store.get_tree(f"jobs/{job_id}/checkpoints/{name}", folder / "checkpoints" / name)


def get_outputs(store: Store, job_id: str, folder: Path) -> list[str]:
    """Copy the job's results (adapter/, model/, job.json, ...) into `folder`; the names copied.
    Nothing is copied before rank 0's marker says they are all there."""
    names = store.files(f"jobs/{job_id}")
    if STORED not in names:
        return []
    tops = sorted({name.split("/")[0] for name in names if name != STORED and not name.startswith("checkpoints/")})
    for top in tops:
        if any(name.startswith(f"{top}/") for name in names):
            store.get_tree(f"jobs/{job_id}/{top}", folder / top)
        else:
            store.get_file(f"jobs/{job_id}/{top}", folder / top)
    return tops
