"""The module names of the stand-in children, as `python -m` and the launchers take them
(LocalProcessLauncher(module=...), create_app's inference_module and inspect_module).
A test that starts one runs from the repository (monkeypatch.chdir(REPO)), so that the
child imports them from there."""

from __future__ import annotations

STAND_IN_WORKER = "tests.helpers.stand_in_worker"  # a training child: speaks the wire, trains nothing
STAND_IN_EXPORT_WORKER = "tests.helpers.stand_in_export_worker"  # an export child: writes small files
STAND_IN_CHAT_CHILD = "tests.helpers.stand_in_chat_child"  # the chat child: echoes, loads no model
STAND_IN_INSPECT_CHILD = "tests.helpers.stand_in_inspect_child"  # the dataset inspection child
HOOKED_CHILD = "tests.helpers.hooked_child"  # the real training child, with test hooks
NAN_WORKER = "tests.helpers.nan_worker"  # a training child whose losses are NaN and infinite
