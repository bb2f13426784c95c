"""`finetune-studio users ...`: accounts, on the data dir directly (jobs/accounts.py).

`create-admin NAME` makes an admin and prints a key with every scope, once; `add NAME` a
user and a key with read, train, chat and files; `remove NAME` removes a user and their
keys; `list` lists users. They write the server's database (SQLite, WAL: a running
server sees them at its next request). The server reads them with accounts on
(FINETUNE_STUDIO_ACCOUNTS=true, or `serve --accounts`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional, TextIO

from finetune_studio.errors import StudioError
from finetune_studio.jobs.accounts import SCOPES, AccountTable, server_secret
from finetune_studio.jobs.store import JobStore
from finetune_studio.wire import DataDir

# A user's first key: everything but admin.
USER_SCOPES = tuple(scope for scope in SCOPES if scope != "admin")


def _table(data_dir: Path) -> tuple[JobStore, AccountTable]:
    layout = DataDir(data_dir)
    store = JobStore(layout.db)  # migrates the database to the accounts' tables
    return store, store.accounts(server_secret(layout.secret))


def run(action: str, data_dir: Path, name: Optional[str], password: Optional[str], out: TextIO = sys.stdout) -> int:
    store, table = _table(data_dir)
    try:
        if action == "list":
            for user in table.users():
                out.write(f"{user.name}{'  (admin)' if user.admin else ''}\n")
            return 0
        assert name is not None  # noqa: S101 (argparse requires it for these actions)
        if action == "remove":
            table.remove_user(name)
            table.audit(None, "user_removed", name, "cli")
            out.write(f"removed {name} and their keys (their jobs and files stay, seen by admins)\n")
            return 0
        admin = action == "create-admin"
        table.add_user(name, password, admin=admin)
        record, key = table.create_key(name, "cli", SCOPES if admin else USER_SCOPES)
        table.audit(None, "user_added", name, "cli", "admin" if admin else None)
        table.audit(None, "key_created", record.id, "cli", f"for {name}: {','.join(record.scopes)}")
        out.write(
            f"{'admin' if admin else 'user'} {name} added. Their key ({', '.join(record.scopes)}), shown this once:\n"
            f"{key}\n"
        )
        return 0
    except StudioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
