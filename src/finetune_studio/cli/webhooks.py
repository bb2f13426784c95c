"""`finetune-studio webhooks add URL --events ... | list | remove ID`: the server's webhooks (docs/API.md, Webhooks)."""

from __future__ import annotations

import json
from typing import Any, Optional, TextIO

from finetune_studio.cli.client import StudioClient


def _line(hook: dict[str, Any]) -> str:
    state = f"disabled: {hook.get('disabled_reason')}" if hook.get("disabled") else "enabled"
    return f"{hook['id']}  {hook['url']}  {','.join(hook['events'])}  ({state})"


def run_add(
    client: StudioClient, url: str, events: list[str], secret: Optional[str], out: TextIO, as_json: bool
) -> int:
    hook = client.add_webhook(url, events, secret)
    if as_json:
        print(json.dumps(hook), file=out)
    else:
        print(_line(hook), file=out)
        print(f"secret: {hook['secret']}  (shown this once: verify each delivery's webhook-signature with it)", file=out)
    return 0


def run_list(client: StudioClient, out: TextIO, as_json: bool) -> int:
    hooks = client.webhooks()
    if as_json:
        print(json.dumps(hooks), file=out)
    elif not hooks:
        print("no webhooks", file=out)
    for hook in [] if as_json else hooks:
        print(_line(hook), file=out)
    return 0


def run_remove(client: StudioClient, webhook_id: str, out: TextIO, as_json: bool) -> int:
    answer = client.remove_webhook(webhook_id)
    print(json.dumps(answer) if as_json else f"removed {webhook_id}", file=out)
    return 0
