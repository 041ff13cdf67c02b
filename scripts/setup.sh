#!/usr/bin/env bash
# Set up qcomm on a fresh machine: .venv with torch 2.11.0 and the test dependencies from PyPI, then
# build the extension in place. Idempotent and quick when already done (pip skips what is installed,
# ninja rebuilds only what changed). Source it or run it; it prints the venv's python at the end.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${QCOMM_PYTHON:-python3}"
VENV="$ROOT/.venv"
TORCH_VERSION="2.11.0"
# module:requirement. ruff and clang-format are pinned so the format check means the same
# everywhere.
DEPS=(numpy:numpy pytest:pytest ninja:ninja setuptools:setuptools wheel:wheel hypothesis:hypothesis
      matplotlib:matplotlib ruff:ruff==0.17.6 clang_format:clang-format==18.1.8
      megatron:megatron-core==0.16.1 gguf:gguf==0.19.0 tokenizers:tokenizers==0.23.3)

log() { printf '[setup] %s\n' "$*" >&2; }

# pip with retries: torch and its CUDA libraries are about 3 GB, and a dropped download should be
# retried, not fail the run. pip's cache (~/.cache/pip) makes a second fresh clone fast.
pip_install() {
  local attempt
  for attempt in 1 2 3; do
    if "$VENV/bin/python" -m pip install --retries 10 --timeout 120 --progress-bar off -q "$@"; then
      return 0
    fi
    log "pip install failed (attempt $attempt/3), retrying in $((attempt * 10)) s"
    sleep $((attempt * 10))
  done
  log "pip install $* failed three times"
  return 1
}

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV with $($PY --version 2>&1)"
  "$PY" -m venv "$VENV"
fi

torch_ok="import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')"
if ! "$VENV/bin/python" -c "$torch_ok" 2>/dev/null; then
  log "installing torch==$TORCH_VERSION (large download on first run)"
  pip_install --upgrade pip
  pip_install "torch==$TORCH_VERSION"
fi

missing=()
for d in "${DEPS[@]}"; do
  mod="${d%%:*}" req="${d#*:}"
  has="import importlib.util, sys; sys.exit(importlib.util.find_spec('$mod') is None)"
  "$VENV/bin/python" -c "$has" 2>/dev/null || missing+=("$req")
done
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing ${missing[*]}"
  pip_install "${missing[@]}"
fi

mkdir -p "$ROOT/build"
log "building qcomm._C and the test hooks, qcomm._testing (MAX_JOBS=${MAX_JOBS:-2})"
export PATH="$VENV/bin:$PATH"
# the tests' hooks, a module of their own that a user's build leaves out (setup.py)
export QCOMM_TEST_HOOKS=1
if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDA_HOME=/usr/local/cuda
fi
MAX_JOBS="${MAX_JOBS:-2}" "$VENV/bin/python" setup.py -q build_ext --inplace \
  >"$ROOT/build/setup.log" 2>&1 || {
  tail -50 "$ROOT/build/setup.log" >&2
  log "build failed; the full log is build/setup.log"
  exit 1
}
"$VENV/bin/python" -c "import qcomm; print('[setup] qcomm ready, CUDA kernels compiled:',
                      qcomm.compiled_with_cuda())" >&2
echo "$VENV/bin/python"
