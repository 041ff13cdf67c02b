#!/usr/bin/env bash
# ThreadSanitizer over the fused two_step's protocol (tests/native/ipc_race.cpp): builds the host
# emulation and its dependencies with -fsanitize=thread against torch's libraries and runs W ranks
# x B blocks as threads. A data race, a disagreement between ranks or a time-out fails it. About a
# minute on 2 cores; run by tests/test_cuda_allreduce.py::test_ipc_protocol_has_no_data_race.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
TORCH="$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
OUTDIR="${QCOMM_TSAN_DIR:-/tmp/qcomm-tsan}"
mkdir -p "$OUTDIR"
cd "$ROOT"
g++ -std=c++17 -O1 -g -fsanitize=thread -fno-omit-frame-pointer -ffp-contract=off \
  -D_GLIBCXX_USE_CXX11_ABI=1 -I csrc -I "$TORCH/include" \
  tests/native/ipc_race.cpp csrc/python/ipc_emulation.cpp csrc/cuda/ipc_layout.cpp \
  csrc/codec/codec_cpu.cpp \
  csrc/plan/plan.cpp csrc/plan/config.cpp \
  -L "$TORCH/lib" -Wl,-rpath,"$TORCH/lib" -ltorch_cpu -lc10 -lpthread \
  -o "$OUTDIR/ipc_race"
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" "$OUTDIR/ipc_race"
