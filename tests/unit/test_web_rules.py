"""The page applies the server's rules as the server does.

`web/rules.js` is written by `finetune_studio.web_rules` from the server's own
constants (the page reads from it whether a run has a model to chat with); a change
to them without `python -m finetune_studio.web_rules` fails here. Where Node.js is
installed, the page's own function is also run on the statuses below and must agree
with the server's (`jobs.phases.has_result`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any, get_args

import pytest

from finetune_studio import web_rules
from finetune_studio.jobs.phases import has_result
from finetune_studio.schemas import Phase

WEB = resources.files("finetune_studio") / "web"


def test_rules_js_is_what_the_server_says() -> None:
    written = (WEB / "rules.js").read_text(encoding="utf-8")
    assert written == web_rules.render(), "web/rules.js is out of date: run `python -m finetune_studio.web_rules`"


def statuses() -> list[dict[str, Any]]:
    saved: list[dict[str, Any]] = [{}, {"adapter_dir": "/j/adapter"}, {"model_dir": "/j/model"}, {"adapter_dir": ""}]
    return [{"phase": phase, "details": details} for phase in get_args(Phase) for details in saved]


def test_the_servers_rule() -> None:
    assert has_result("completed", {}) and has_result("stopped", {"model_dir": "/j/model"})
    assert not has_result("stopped", {}) and not has_result("stopped", {"adapter_dir": ""})
    assert not any(has_result(phase, {"adapter_dir": "/j/adapter"}) for phase in ("idle", "training", "error"))


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js runs the page's module")
def test_the_page_decides_as_the_server_does() -> None:
    cases = statuses() + [{"phase": "completed"}, None]
    script = (
        f"const {{ isServable }} = await import({json.dumps(Path(str(WEB / 'jobs.js')).as_uri())});"
        f"console.log(JSON.stringify({json.dumps(cases)}.map((status) => isServable(status))));"
    )
    result = subprocess.run(
        ["node", "--input-type=module", "-e", script], capture_output=True, text=True, check=True, timeout=60
    )
    page = json.loads(result.stdout.strip().splitlines()[-1])
    server = [status is not None and has_result(status["phase"], status.get("details") or {}) for status in cases]
    assert page == server, [(case, p, s) for case, p, s in zip(cases, page, server, strict=True) if p != s]
