#!/usr/bin/env bash
# The tests: install everything they need (Chromium too, for the browser tests),
# run the static checks (scripts/check.sh), then the whole suite. Extra arguments
# go to pytest (e.g. -m "not slow" for the fast lane).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "installing Chromium for the browser tests ..."
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
bash scripts/install.sh
bash scripts/check.sh
exec .venv/bin/python -m pytest "$@"
