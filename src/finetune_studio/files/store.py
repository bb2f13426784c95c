"""FileStore: the stored files, their rows in the `files` table (migration 3 of
jobs/store.py) and their bytes under `<data-dir>/files/`.

Adding a file has two halves, so that a large upload never blocks the server's
event loop:

- `ingest` (any thread; no database): copies the upload into `.<id>.partial`,
  refusing it past `max_bytes`, checks it for its purpose (checks.py), writes what
  the trainer reads beside it (a preference file's DPO rows), then renames it into
  place: a stored file is complete or absent.
- `record` (the loop's thread): inserts its row.

The Python API for other parts of the server (the page's uploads use purpose
`studio`):

    ingested = await asyncio.to_thread(files.ingest, stream, "data.jsonl", "studio", max_bytes)
    stored = files.record(ingested)          # StoredFile: id, path, facts ...
    files.get(file_id) / files.list(...) / files.delete(file_id)

`StoredFile.path` is what a training request names in `local_datasets`.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Optional

from finetune_studio.atomic import is_partial, write_atomically
from finetune_studio.errors import FileNotFound, FileTooLarge
from finetune_studio.files.checks import STUDIO_SUFFIXES, FileFacts, check_file
from finetune_studio.files.preference import write_dpo_rows
from finetune_studio.jobs.accounts import acting_owner, sees
from finetune_studio.jobs.sql import connect, insert_next, matching, record

_COPY_CHUNK = 1024 * 1024
DPO_SUFFIX = ".dpo.jsonl"


@dataclass(frozen=True)
class Ingested:
    """A checked file in place, not yet recorded."""

    id: str
    purpose: str
    filename: str
    bytes: int
    path: Path
    facts: FileFacts


@dataclass(frozen=True)
class StoredFile:
    id: str
    created_at: float
    purpose: str
    filename: str
    bytes: int
    path: Path
    facts: FileFacts

    @property
    def dpo_path(self) -> Path:
        """A preference file's rows as the DPO trainer reads them (written when it was added)."""
        return self.path.with_name(self.id + DPO_SUFFIX)


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


class FileStore:
    def __init__(self, db_path: Path, folder: Path) -> None:
        """`db_path` is the JobStore's database, migrated by it (the `files` table is its migration 3)."""
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._db = connect(db_path)
        self._sweep_partials()

    def close(self) -> None:
        self._db.close()

    def _sweep_partials(self) -> None:
        """Uploads cut off by a crash leave `.partial` files; nothing refers to them."""
        for partial in filter(is_partial, self.folder.iterdir()):
            with contextlib.suppress(OSError):
                partial.unlink()

    # -- adding ---------------------------------------------------------------

    def ingest(self, source: BinaryIO, filename: str, purpose: str, max_bytes: int) -> Ingested:
        """Copy, check and place a file (blocking: call it in a thread). InvalidFile when it
        is over `max_bytes` or does not fit its purpose; nothing is left behind then."""
        file_id = new_file_id()
        suffix = Path(filename).suffix.lower()
        final = self.folder / (file_id + (suffix if purpose == "studio" and suffix in STUDIO_SUFFIXES else ".jsonl"))
        derived = final.with_name(file_id + DPO_SUFFIX)
        try:
            with write_atomically(final) as partial:
                size = _copy(source, partial, max_bytes, filename)
                facts = check_file(partial, purpose, filename)
                if facts.format == "preference":
                    with write_atomically(derived) as rows:
                        write_dpo_rows(partial, rows)
        except BaseException:
            with contextlib.suppress(OSError):
                derived.unlink()
            raise
        return Ingested(file_id, purpose, filename, size, final, facts)

    def record(self, ingested: Ingested) -> StoredFile:
        """Insert the ingested file's row, owned by the current request's user (jobs/accounts.py).
        When that fails (a full database), the file's bytes are removed too: a file no row names
        would only take the space."""
        now = time.time()
        try:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                insert_next(self._db, "files", {
                    "id": ingested.id, "created_at": now, "purpose": ingested.purpose, "filename": ingested.filename,
                    "bytes": ingested.bytes, "path": str(ingested.path), "facts_json": json.dumps(ingested.facts.to_json()),
                    "owner": acting_owner()})
        except BaseException:
            for path in (ingested.path, ingested.path.with_name(ingested.id + DPO_SUFFIX)):
                with contextlib.suppress(OSError):
                    path.unlink()
            raise
        return self.get(ingested.id)

    # -- reading ----------------------------------------------------------------

    def get(self, file_id: str) -> StoredFile:
        row = self._db.execute("SELECT * FROM files WHERE id = ?", (file_id,)).fetchone()
        if row is None:
            raise file_not_found(file_id)
        return _stored(row)

    def get_visible(self, file_id: str) -> StoredFile:
        """The file, as `get`, when the current request may see it: another user's is not found, as an unknown id."""
        row = self._db.execute("SELECT * FROM files WHERE id = ?", (file_id,)).fetchone()
        if row is None or not sees(row["owner"]):
            raise file_not_found(file_id)
        return _stored(row)

    def owner_of(self, file_id: str) -> Optional[str]:
        """The file's owner (None: none recorded); FileNotFound for an unknown id."""
        row = self._db.execute("SELECT owner FROM files WHERE id = ?", (file_id,)).fetchone()
        if row is None:
            raise file_not_found(file_id)
        return None if row[0] is None else str(row[0])

    def list(
        self, purpose: Optional[str] = None, after: Optional[str] = None, limit: int = 10_000, newest_first: bool = True,
        owner: Optional[str] = None,
    ) -> tuple[list[StoredFile], bool]:
        """A page of files (and whether more follow), after the file `after` in the order asked;
        with `owner`, only that user's."""
        where, params = matching({"owner": owner, "purpose": purpose})
        query = f"SELECT * FROM files WHERE {where}"  # noqa: S608 (placeholders only)
        if after is not None:
            # The cursor is looked up among the files the caller may see: another user's file id
            # is as unknown as one that never existed (no existence oracle through `after`).
            if owner is None:
                seq = self._db.execute("SELECT seq FROM files WHERE id = ?", (after,)).fetchone()
            else:
                seq = self._db.execute("SELECT seq FROM files WHERE id = ? AND owner = ?", (after, owner)).fetchone()
            if seq is None:
                raise FileNotFound(f"after: no file with id {after!r}", param="after")
            query += " AND seq < ?" if newest_first else " AND seq > ?"
            params.append(seq[0])
        query += (" ORDER BY seq DESC" if newest_first else " ORDER BY seq") + " LIMIT ?"
        rows = self._db.execute(query, (*params, limit + 1)).fetchall()
        return [_stored(row) for row in rows[:limit]], len(rows) > limit

    # -- removing ---------------------------------------------------------------

    def delete(self, file_id: str) -> StoredFile:
        stored = self.get(file_id)
        self._db.execute("DELETE FROM files WHERE id = ?", (file_id,))
        for path in (stored.path, stored.dpo_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return stored


def file_not_found(file_id: str) -> FileNotFound:
    """What an unknown file id answers (and another user's file, with accounts on)."""
    return FileNotFound(f"no file with id {file_id!r}; GET /v1/files lists the stored files", param="file_id")


def _copy(source: BinaryIO, target: Path, max_bytes: int, filename: str) -> int:
    size = 0
    with target.open("wb") as out:
        while chunk := source.read(_COPY_CHUNK):
            size += len(chunk)
            if size > max_bytes:
                raise FileTooLarge(max_bytes)  # 413, as a body over the limit is
            out.write(chunk)
    return size


def _stored(row: sqlite3.Row) -> StoredFile:
    return record(StoredFile, row, path=lambda row: Path(row["path"]),
                  facts=lambda row: FileFacts.from_json(json.loads(row["facts_json"])))
