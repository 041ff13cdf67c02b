#!/usr/bin/env bash
# Runs one of PyTorch's own distributed test files against qnccl, every quantized collective on:
#   bash scripts/torch_suite.sh TORCH/test/distributed/tensor/test_redistribute.py [pytest args]
# The file (TORCH: a PyTorch checkout) comes from the tag of the installed torch (2.11.0; the wheel
# ships no tests). Every process group the tests create on "gloo" is created on "qnccl"
# (scripts/torch_suite/sitecustomize.py), with QCOMM_REDUCE_SCATTER=1, QCOMM_ALL_GATHER=1,
# QCOMM_MIN_BYTES=0 (the tests' tensors are small) and QCOMM_TUNE=0 (on one host the tuner would
# send most of them to exact), unless the environment sets them otherwise.
# Prints the tests' outcome, the calls quantized and passed through per collective, and each
# failure as "tolerance" (a value compared exactly that the codec changed within its bound),
# "fails on Gloo too" (rerun without qnccl: the file and the installed torch disagree) or
# "other"; exits 1 on any other failure. Logs under QCOMM_SUITE_OUT (default:
# a new folder under /tmp). docs/torch_native.md has the last run's numbers.
set -euo pipefail
[ $# -ge 1 ] && [ -f "$1" ] || { sed -n 2,13p "$0" >&2; exit 2; }
TEST="$(realpath "$1")"
shift
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$(bash scripts/setup.sh)"
# torch.testing._internal needs expecttest, which torch's wheel does not declare
"$PY" -c "import expecttest" 2>/dev/null || "$PY" -m pip install -q expecttest
OUT="${QCOMM_SUITE_OUT:-$(mktemp -d /tmp/qcomm-torch-suite.XXXXXX)}"
mkdir -p "$OUT"
rm -f "$OUT"/stats-*.json
echo "[torch_suite] $TEST on qnccl; logs in $OUT"
set +e
SITE="$ROOT/scripts/torch_suite:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
QCOMM_TORCH_SUITE_OUT="$OUT" PYTHONPATH="$SITE" \
  QCOMM_REDUCE_SCATTER="${QCOMM_REDUCE_SCATTER:-1}" QCOMM_ALL_GATHER="${QCOMM_ALL_GATHER:-1}" \
  QCOMM_MIN_BYTES="${QCOMM_MIN_BYTES:-0}" QCOMM_TUNE="${QCOMM_TUNE:-0}" \
  "$PY" -m pytest "$TEST" -p no:cacheprovider -o addopts="" -q --rootdir "$(dirname "$TEST")" \
  --junitxml "$OUT/junit.xml" "$@" > "$OUT/pytest.log" 2>&1
set -e
tail -n 1 "$OUT/pytest.log"
rm -f "$OUT/junit-gloo.xml"
"$PY" scripts/torch_suite/summary.py "$OUT" "$TEST" > /dev/null || true
if [ -s "$OUT/others.txt" ]; then
  # the failures that are neither tolerance: the same tests on Gloo alone, to tell ours apart
  echo "[torch_suite] rerunning $(wc -l < "$OUT/others.txt") other failure(s) on Gloo alone"
  mapfile -t IDS < "$OUT/others.txt"
  "$PY" -m pytest "${IDS[@]}" -p no:cacheprovider -o addopts="" -q --rootdir "$(dirname "$TEST")" \
    --junitxml "$OUT/junit-gloo.xml" > "$OUT/pytest-gloo.log" 2>&1 || true
fi
"$PY" scripts/torch_suite/summary.py "$OUT" "$TEST"
