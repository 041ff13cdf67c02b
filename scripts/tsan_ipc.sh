#!/usr/bin/env bash
# ThreadSanitizer over the separate kernels' exchange (tests/native/exchange_race.cpp): builds the
# host emulation of the exchange and its barrier with -fsanitize=thread against torch's libraries
# and runs W ranks as threads. A data race, a byte out of place or a barrier that gives up fails
# it. Under a minute on 2 cores; run by
# tests/transport/test_ipc_exchange.py::test_ipc_exchange_has_no_data_race. (The fused
# experiment's protocol: bash scripts/experiments_check.sh tsan.)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
TORCH="$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
OUTDIR="${QCOMM_TSAN_DIR:-/tmp/qcomm-tsan}"
mkdir -p "$OUTDIR"
cd "$ROOT"
g++ -std=c++17 -O1 -g -fsanitize=thread -fno-omit-frame-pointer -ffp-contract=off \
  -D_GLIBCXX_USE_CXX11_ABI=1 -I csrc -I "$TORCH/include" \
  tests/native/exchange_race.cpp csrc/testing/ipc_emulation.cpp csrc/cuda/ipc_layout.cpp \
  -L "$TORCH/lib" -Wl,-rpath,"$TORCH/lib" -ltorch_cpu -lc10 -lpthread \
  -o "$OUTDIR/exchange_race"
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" "$OUTDIR/exchange_race"
