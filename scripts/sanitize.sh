#!/usr/bin/env bash
# Build qcomm with AddressSanitizer and UndefinedBehaviorSanitizer in a scratch copy of the tree and
# run the CPU test suite under them (spawned ranks inherit the preloaded runtime). torch itself is
# not instrumented; the extension's own memory accesses and arithmetic are. Leak checking is off:
# CPython and torch keep allocations alive at exit by design. Takes ~10 minutes on 2 cores.
#   bash scripts/sanitize.sh                 # the whole CPU suite
#   bash scripts/sanitize.sh -k codec        # extra arguments go to pytest
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/scripts/setup.sh")"
WORK="${QCOMM_SANITIZE_DIR:-/tmp/qcomm-sanitize}"
rm -rf "$WORK"
mkdir -p "$WORK"
# the tracked and untracked-but-not-ignored files: what a clean clone would hold
(cd "$ROOT" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$WORK")
cd "$WORK"
echo "[sanitize] building in $WORK with -fsanitize=address,undefined" >&2
export QCOMM_CUDA=0  # a CPU-only build; tests/cuda/test_build.py reads this too
FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
QCOMM_EXTRA_CFLAGS="$FLAGS" QCOMM_TEST_HOOKS=1 MAX_JOBS="${MAX_JOBS:-2}" \
  "$PY" setup.py -q build_ext --inplace >build.log 2>&1 || { tail -40 build.log; exit 1; }
ASAN_LIB="$(gcc -print-file-name=libasan.so)"
UBSAN_LIB="$(gcc -print-file-name=libubsan.so)"
export LD_PRELOAD="$ASAN_LIB:$UBSAN_LIB"
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export PYTHONPATH="$WORK"
export QCOMM_UNDER_SANITIZER=1  # tests that read RSS skip that one check
echo "[sanitize] running pytest under ASan+UBSan" >&2
exec "$PY" -m pytest -q -p no:cacheprovider "$@"
