#!/usr/bin/env bash
# The test command: set up what is missing (venv, torch, the build), check formatting, run pytest.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k codec` or `-m full_sweep`.
# `--quick` (first argument) runs the quick tier instead of the default one: every layer once, in
# at most 3 minutes on 2 cores (tests/conftest.py QUICK; docs/testing.md says which to run when).
set -euo pipefail
TIER=()
if [ "${1:-}" = "--quick" ]; then
  shift
  TIER=(-m "quick and not full_sweep and not large and not simt_matrix and not sanitizer")
fi
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
set +e
"$PY" -m pytest "${TIER[@]}" "$@"
rc=$?
set -e
# pytest's 5: no test was collected (a -k or -m that matches nothing): an error, not a pass
[ "$rc" -ne 5 ] || echo "[test] no test was collected" >&2
exit "$rc"
