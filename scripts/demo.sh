#!/usr/bin/env bash
# The demo: install everything, then start a server, train a job end to end on a
# tiny model built on the spot, and show its progress in the terminal.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/finetune-studio demo "$@"
