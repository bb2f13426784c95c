"""Every way data enters meets the same limits and path rules. A local file named
through `hf_dataset` used to be trained although the same file in `local_datasets`
was refused as too large; a local folder there was not looked into at all."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest

from finetune_studio.api import admission
from tests.helpers.jobs import InstantLauncher, start_body

LIMIT = 100


def _file(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"text": "' + "a" * (size - 13) + '"}\n')
    assert path.stat().st_size == size
    return path


def _start(server: Any, headers: Optional[dict[str, str]] = None, **fields: Any) -> httpx.Response:
    body = {**start_body(Path("unused")), "local_datasets": [], **fields}
    return httpx.post(f"{server.url}/train/start", json=body, headers=headers, timeout=60)


def test_hf_dataset_files_and_folders_meet_the_dataset_size_limit(
    live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = live_server(launcher=InstantLauncher(), max_dataset_bytes=LIMIT)
    big = _file(tmp_path / "big.jsonl", LIMIT + 1)
    fits = _file(tmp_path / "fits.jsonl", LIMIT)

    # The same file, by either door: refused the same way.
    for fields in ({"local_datasets": [str(big)]}, {"hf_dataset": str(big)}):
        refused = _start(server, **fields)
        assert refused.status_code == 400, (fields, refused.text)
        assert f"dataset file {big} is 101 bytes, over this server's limit of 100 bytes" in refused.json()["error"]
    assert _start(server, hf_dataset=str(fits)).status_code == 200

    # A folder: each of its data files, in subfolders and behind links too.
    folder = tmp_path / "set"
    _file(folder / "train" / "part-0.jsonl", LIMIT)
    _file(folder / ".cache" / "ignored.bin", 10 * LIMIT)  # hidden: datasets does not read it
    assert _start(server, hf_dataset=str(folder)).status_code == 200
    os.symlink(big, folder / "train" / "part-1.jsonl")
    refused = _start(server, hf_dataset=str(folder))
    assert refused.status_code == 400
    assert f"dataset file {folder / 'train' / 'part-1.jsonl'} (in hf_dataset {folder}) is 101 bytes" in refused.json()["error"]
    (folder / "train" / "part-1.jsonl").unlink()

    # A folder that is no dataset folder ("/", "~") is not walked without end.
    monkeypatch.setattr(admission, "MAX_FOLDER_FILES", 3)
    for index in range(3):
        _file(folder / f"more-{index}.jsonl", 20)
    refused = _start(server, hf_dataset=str(folder))
    assert refused.status_code == 400 and "holds more than 3 files" in refused.json()["error"]

    # A local path that is not there: refused at once, like a missing local_datasets file.
    refused = _start(server, hf_dataset=str(tmp_path / "nowhere.jsonl"))
    assert refused.status_code == 400
    assert refused.json()["error"].startswith(f"dataset file not found: {tmp_path / 'nowhere.jsonl'}; check the paths in hf_dataset")
    # A hub id is the child's to fetch: not a path, not checked here.
    assert _start(server, hf_dataset="some-org/some-dataset").status_code == 200


def test_a_link_in_an_hf_dataset_folder_cannot_lead_out_of_the_roots(live_server: Any, tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    secret = _file(outside / "secret.jsonl", 50)
    folder = root / "set"
    _file(folder / "part-0.jsonl", 50)
    token = "dataset-sources-token"
    server = live_server(launcher=InstantLauncher(), host="0.0.0.0", token=token, allowed_roots=[root])
    auth = {"Authorization": f"Bearer {token}"}
    assert _start(server, auth, hf_dataset=str(folder)).status_code == 200
    for link in (folder / "part-1.jsonl", folder / "sub"):
        os.symlink(secret if link.suffix else outside, link)
        refused = _start(server, auth, hf_dataset=str(folder))
        assert refused.status_code == 403, refused.text
        assert f"hf_dataset: {link} in {str(folder)!r} leads outside the folders" in refused.json()["error"]
        link.unlink()
