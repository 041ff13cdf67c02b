#!/usr/bin/env bash
# The test command: set up what is missing (venv, torch, the build), check formatting, run pytest.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k codec` or `-m full_sweep`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$(bash scripts/setup.sh)"
BIN="$(dirname "$PY")"

echo "[test] format check: ruff (Python), clang-format (C++/CUDA)"
"$BIN/ruff" check qcomm qcomm_autoload.py setup.py tests benchmarks scripts examples
"$BIN/ruff" format --check qcomm qcomm_autoload.py setup.py tests benchmarks scripts examples
mapfile -t CSRC < <(find csrc tests/native tests/experiments benchmarks/cuda \
  \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null | sort)
"$BIN/clang-format" --dry-run -Werror "${CSRC[@]}"

echo "[test] pytest"
exec "$PY" -m pytest "$@"
