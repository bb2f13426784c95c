"""The one atomic save: a file or a folder appears under its final name whole, or not at all.

Plain Python (the standard library only): the server, every child, the Ray workers
and the CLI use it alike.

Everything is first written beside its final name under a partial name (one rule,
`partial_path`: `.NAME.partial`, or `.NAME.<hex>.partial` for writers that may race
on one name), flushed to disk (fsync), renamed into place in one step (`os.replace`),
and the folder that holds it is flushed too, so that after a crash or a SIGKILL the
final name holds the old content or the new, never a part of it. A partial is removed
on any failure (KeyboardInterrupt included); one a killed process left behind starts
with a dot and ends with `.partial` (`is_partial`), which is what every reader skips
and every sweep removes.

    write_file(final, data)                   a file, from bytes or text (job.json)
    with write_atomically(final) as partial:  a file someone streams into partial (a
        ...                                   download, a converter's --outfile)
    with save_atomically(final) as partial:   a folder built in partial/ (an adapter,
        ...                                   a merged model, a checkpoint's copy)
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Union

PARTIAL_SUFFIX = ".partial"


def partial_path(final: Path, *, unique: bool = False) -> Path:
    """Where final is written before it is renamed into place: `.NAME.partial` beside it;
    with `unique`, `.NAME.<hex>.partial`, a fresh name for each writer."""
    middle = f".{secrets.token_hex(4)}" if unique else ""
    return final.with_name(f".{final.name}{middle}{PARTIAL_SUFFIX}")


def is_partial(path: Union[Path, str]) -> bool:
    """Whether path is named as something not yet whole (any form `partial_path` makes)."""
    name = Path(path).name
    return name.startswith(".") and name.endswith(PARTIAL_SUFFIX) and len(name) > len(PARTIAL_SUFFIX)


def remove(path: Path) -> None:
    """A file or a folder, gone (absent already is fine)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def write_file(final: Path, data: Union[bytes, str]) -> None:
    """Write data (text is UTF-8) to final atomically."""
    with write_atomically(final) as partial, open(partial, "wb") as handle:
        handle.write(data.encode() if isinstance(data, str) else data)


@contextlib.contextmanager
def write_atomically(final: Path, *, unique: bool = False, resume: bool = False, flush: bool = True) -> Iterator[Path]:
    """Yield the partial path to write final's content to (by this process or another).
    When the block succeeds the file is flushed and renamed to final in one step; when
    it fails it is removed.

    `resume`: a download that goes on where a broken one stopped. The partial an earlier
    try left is handed out as it is, and one this try leaves on a failure is kept.

    `flush=False`: a work file its writer removes when it is done (an export's 16-bit
    intermediate): renamed into place, never a part under the final name, but not flushed
    to disk, which on a large file costs more than writing it (1.6 s for 270 MB here). No
    crash can leave it taken for finished: nothing reads a work folder after one."""
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(final, unique=unique)
    if not resume or partial.is_dir():
        remove(partial)
    try:
        yield partial
        if not partial.is_file() or partial.is_symlink():
            raise FileNotFoundError(f"{partial} was not written")
        if flush:
            _fsync(partial)
        os.replace(partial, final)
        if flush:
            _fsync(final.parent)
    except BaseException:
        if not resume:
            remove(partial)
        raise


@contextlib.contextmanager
def save_atomically(final: Path, *, unique: bool = False, replace: bool = True, flush: bool = True) -> Iterator[Path]:
    """Yield a fresh, empty partial folder beside final; when the block succeeds its files
    are flushed and it takes final's place, so final is always complete or absent (an old
    final is moved aside under a partial name first, then removed).

    `replace=False`: a final already there (another process on this node put the same
    content first) is kept, and this copy is dropped. `flush=False`: a work folder, as
    `write_atomically` says."""
    final.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(final, unique=unique)
    remove(partial)
    partial.mkdir()
    try:
        yield partial
        if _exists(final) and not replace:
            return
        if flush:
            _fsync_tree(partial)
        _put_folder(partial, final, replace, flush)
    finally:
        remove(partial)  # gone already when it was renamed into place


def _put_folder(partial: Path, final: Path, replace: bool, flush: bool = True) -> None:
    if not _exists(final):
        try:
            os.replace(partial, final)
        except OSError:
            if replace or not final.is_dir():
                raise
            return  # another process put its copy there meanwhile: keep it
        if flush:
            _fsync(final.parent)
        return
    old = partial_path(final, unique=True)  # named as partial: a sweep takes it if we die here
    os.replace(final, old)
    try:
        os.replace(partial, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.replace(old, final)
        raise
    if flush:
        _fsync(final.parent)
    remove(old)


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _fsync(path: Path) -> None:
    """Flush a file's data, or a folder's entries, to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    for root, _dirs, names in os.walk(folder):
        for name in names:
            path = Path(root) / name
            if path.is_file() and not path.is_symlink():
                _fsync(path)
        _fsync(Path(root))
