"""The job state machine: the phases and which changes between them are allowed.

    idle --> loading_model --> loading_dataset --> configuring --> training --> completed
      \\            \\                 \\                  \\              \\
       `------------`-----------------`------------------`--------------`--> error | stopped

Every phase change in the system goes through `JobStore.transition`, which only
updates a row whose current phase is one this table allows.
"""

from __future__ import annotations

from typing import get_args

from finetune_studio.schemas import Phase

PHASES: tuple[str, ...] = get_args(Phase)
TERMINAL: frozenset[str] = frozenset({"completed", "error", "stopped"})
RUNNING: frozenset[str] = frozenset({"loading_model", "loading_dataset", "configuring", "training"})

_ENDINGS = {"error", "stopped"}
ALLOWED_FROM: dict[str, frozenset[str]] = {
    # target phase: the phases it may be entered from
    "loading_model": frozenset({"idle"}),
    "loading_dataset": frozenset({"loading_model"}),
    "configuring": frozenset({"loading_dataset"}),
    "training": frozenset({"configuring"}),
    "completed": frozenset({"training"}),
    "error": frozenset({"idle"}) | RUNNING,
    "stopped": frozenset({"idle"}) | RUNNING,
}


def is_terminal(phase: str) -> bool:
    return phase in TERMINAL


def can_enter(target: str, current: str) -> bool:
    return current in ALLOWED_FROM.get(target, frozenset())
