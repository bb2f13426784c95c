"""Exports through a real server with the real export child (`finetune_studio.export.child`):
a LoRA job trained on the tiny model, exported as merged 16-bit safetensors and as
GGUF, followed over the export stream and downloaded by the CLI. llama.cpp's own
checks of the files are tests/integration/test_export_gguf.py; this is the path from
the request to the downloaded file."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from finetune_studio.export.tools import tools_problem
from tests.helpers.jobs import collect, job_request, phases
from tests.helpers.servers import ServerProcess

pytestmark = pytest.mark.train


def test_a_trained_job_exports_through_the_server_and_the_cli_downloads_it(
    server: ServerProcess, tiny_model: Path, tmp_path: Path
) -> None:
    with server.client() as client:
        job_id = client.start(job_request(tiny_model, max_steps=2))
        assert phases(collect(client, job_id))[-1] == "completed"

        export_id = client.start_export({"job_id": job_id, "format": "merged_16bit"})
        events = list(client.stream(export_id, prefix="/export"))
        statuses = [event.data for event in events if event.kind == "status"]
        assert [status["phase"] for status in statuses] == ["idle", "loading_model", "merging", "completed"], statuses[-1]
        assert any(event.kind == "progress" and event.data["stage"] == "merging" for event in events)
        files = {entry["name"] for entry in statuses[-1]["details"]["files"]}
        assert "merged/config.json" in files and any(name.endswith(".safetensors") for name in files)
        target = tmp_path / "config.json"
        client.download(export_id, "merged/config.json", target)
        assert json.loads(target.read_text())["model_type"] == "llama"

    if tools_problem() is not None:
        pytest.skip(f"the GGUF part needs llama.cpp's tools: {tools_problem()}")
    # The tiny model's home-made BPE tokenizer is one llama.cpp's converter does not
    # know (SmolLM2's it does: test_export_gguf.py), so its GGUF export fails in the
    # converter: the failure comes back in words, over the stream, to the CLI, and
    # leaves no file behind.
    from finetune_studio.cli.export_job import run_export_job
    from finetune_studio.cli.main import build_parser

    out, err = io.StringIO(), io.StringIO()
    args = build_parser().parse_args(
        ["export", job_id, "--gguf", "q8_0", "--out", str(tmp_path / "gguf"), "--server", server.url, "--no-start-server"]
    )
    assert run_export_job(args, out, err) == 1
    assert "ended error (export_failed): convert_hf_to_gguf.py failed" in err.getvalue()
    assert "[converting]" in out.getvalue()
    assert not (tmp_path / "gguf").exists()
    with server.client() as client:
        failed = client.exports(job_id=job_id)[0]
    assert failed["phase"] == "error" and failed["details"]["error_code"] == "export_failed"
    folder = server.data_dir / "exports" / failed["export_id"]
    assert sorted(path.name for path in folder.iterdir()) == ["worker.log"]
