"""The real app under uvicorn in a process of its own, whose training jobs run the stand-in
worker (tests/helpers/stand_in_worker.py): for tests that SIGKILL the server itself.

    python -m tests.helpers.stand_in_server PORT     (settings from FINETUNE_STUDIO_* as usual)
"""

from __future__ import annotations

import sys

import uvicorn

from finetune_studio.api.app import create_app
from finetune_studio.config import get_settings
from finetune_studio.supervisor.launcher import LocalProcessLauncher
from tests.helpers.children import STAND_IN_WORKER


def main() -> None:
    port = int(sys.argv[1])
    settings = get_settings(port=port)
    app = create_app(settings, LocalProcessLauncher(module=STAND_IN_WORKER))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", ws="none")


if __name__ == "__main__":
    main()
