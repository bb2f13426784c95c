"""The request defaults that suit the server's machine, picked as the page picks them.

The page's start form asks `GET /system` once and takes each field of its
`recommended` as that field's default (web/form.js, `StartForm.defaultOf`), so that a
server without CUDA (or without bitsandbytes) is not asked for 4-bit loading or an
8-bit optimizer, which its training child would only fall back from with a warning.
`train` and `demo` do the same here:

    ask_machine(client)                  the server's answer, or None when it cannot say
    machine_defaults(request, machine)   the recommended fields that the request leaves unset
    Machine.note(filled)                 one line for the user when those turn something off
    fit_to_machine(request, client, say) the three together: the request to send, or None
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

from finetune_studio.cli.client import StudioClient, StudioError


@dataclass(frozen=True)
class Machine:
    """What `GET /system` says the server's machine can train with."""

    recommended: dict[str, Any]
    cuda: bool
    bitsandbytes: bool

    def note(self, filled: Mapping[str, Any]) -> Optional[str]:
        """Why the filled fields are what they are, when they turn 4-bit loading off (the page's
        `StartForm.renderSystem` says the same beside the form); None when there is nothing to say."""
        if not filled or self.recommended.get("load_in_4bit", True):
            return None
        why = "bitsandbytes is not installed there" if self.cuda else "the server has no CUDA GPU"
        fields = ", ".join(f"{name}={_json_text(value)}" for name, value in filled.items())
        return f"{why}, so 4-bit loading and the 8-bit optimizer are off ({fields})"


def _json_text(value: Any) -> str:
    # As the user would write it in --set: true/false, not Python's True/False.
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def ask_machine(client: StudioClient) -> Optional[Machine]:
    """The server's `GET /system`, or None when it gives none (an older server without the
    route, a refusal, an answer of another shape): the caller then sends what it did before."""
    try:
        answer = client.system()
    except (StudioError, ValueError):  # ValueError: a 200 that is no JSON (not this server's route)
        return None
    recommended = answer.get("recommended") if isinstance(answer, dict) else None
    if not isinstance(recommended, dict) or not all(isinstance(name, str) for name in recommended):
        return None
    return Machine(recommended=dict(recommended), cuda=answer.get("cuda") is True, bitsandbytes=answer.get("bitsandbytes") is True)


def machine_defaults(request: Mapping[str, Any], machine: Machine) -> dict[str, Any]:
    """The recommended fields that `request` does not set, at their recommended values.

    The page's counterpart is `StartForm.defaultOf` in web/form.js: a field that
    `recommended` names defaults to its value there. Here a field the request already
    has (a flag, --set, --device cpu) is the user's choice and wins.
    """
    return {name: value for name, value in machine.recommended.items() if name not in request}


def fit_to_machine(request: Mapping[str, Any], client: StudioClient, say: Callable[[str], None]) -> Optional[dict[str, Any]]:
    """`request` with the recommended fields it leaves unset, after one `GET /system` (and a
    line to `say` when they turn 4-bit loading off); None when the server cannot say."""
    machine = ask_machine(client)
    if machine is None:
        return None
    filled = machine_defaults(request, machine)
    note = machine.note(filled)
    if note:
        say(note)
    return {**request, **filled}
