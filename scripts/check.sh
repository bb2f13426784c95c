#!/usr/bin/env bash
# The static checks: the import rules between processes (import-linter), no import
# cycle among src/'s modules (scripts/import_cycles.py), lint (ruff) and types
# (mypy --strict). scripts/test.sh runs them before the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== import rules (lint-imports)"
.venv/bin/lint-imports
echo "== import cycles (scripts/import_cycles.py)"
.venv/bin/python scripts/import_cycles.py
echo "== lint (ruff)"
.venv/bin/ruff check src tests bench
echo "== types (mypy --strict)"
.venv/bin/mypy
