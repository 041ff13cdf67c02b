#!/usr/bin/env bash
# Runs the CUDA kernels' own sources on the CPU under the SIMT emulator (tests/native/simt): the
# codec kernels against the CPU codec bit for bit, and the separate kernels over CUDA IPC (the copy
# and barrier kernels of csrc/cuda/ipc_kernels.cu) under the exchange's schedule, W ranks as
# threads. No GPU needed; nvcc is not used (g++ compiles the .cu files as C++ with
# tests/native/simt/simt.h forced in), only the toolkit's headers.
#   scripts/simt_check.sh [codec|exchange|all] [--quick]
#   scripts/simt_check.sh schedules DIR [buffer_bytes]   (the schedules with the CUDA codec)
#   scripts/simt_check.sh self [ok|divergent|exit|deadlock|race]   (the emulator's own test)
# SIMT_TSAN=1 builds the kernels with ThreadSanitizer (a separate build directory).
# Run by tests/cuda/test_simt_emulation.py. Exits non-zero on a difference or an emulator error.
# (The fused two_step experiment's kernel: bash scripts/experiments_check.sh simt, which uses the
# emulator built here through the same obj rule.)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
WHAT="${1:-all}"
shift || true
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
if [[ ! -f "$CUDA_HOME/include/cuda_runtime.h" ]]; then
  echo "simt_check: no CUDA headers at $CUDA_HOME/include" >&2
  exit 3
fi
TORCH="$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
OUTDIR="${QCOMM_SIMT_DIR:-/tmp/qcomm-simt}"
[[ "${SIMT_TSAN:-0}" == 1 ]] && OUTDIR="$OUTDIR-tsan"
mkdir -p "$OUTDIR"
cd "$ROOT"
CXX="${CXX_SIMT:-g++}"
FLAGS=(-std=c++17 -O2 -g -ffp-contract=off -fno-strict-aliasing -D_GLIBCXX_USE_CXX11_ABI=1
  -I csrc -I "$CUDA_HOME/include" -I "$TORCH/include")
# shellcheck disable=SC2054  # -Wl,-rpath,DIR is one argument
LIBS=(-L "$TORCH/lib" -Wl,-rpath,"$TORCH/lib" -ltorch_cpu -lc10 -lpthread -fsanitize=alignment)
# the kernels: host C++ with the emulator forced in; a misaligned vector access (a trap on the
# GPU) aborts under UBSan's alignment check
KERNEL=(-x c++ -include tests/native/simt/simt.h -fsanitize=alignment
  -fno-sanitize-recover=alignment)
EMU=()  # the emulator's own runtime: never instrumented
if [[ "${SIMT_TSAN:-0}" == 1 ]]; then
  # ThreadSanitizer over the kernels: every CUDA thread a TSan fiber, ordered only by barriers
  # and atomics (simt.h), so a missing __syncwarp/__syncthreads is a reported race
  FLAGS+=(-fsanitize=thread -fno-omit-frame-pointer)
  LIBS+=(-fsanitize=thread)
  EMU=(-fno-sanitize=thread -DQCOMM_SIMT_TSAN=1)
  export TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}"
fi

# The objects scripts/setup.sh built for the extension (build/temp.*, or QCOMM_BUILD_DIR's) are
# linked as they are where ninja says one is up to date with its source and the headers it
# includes, and none of those holds CUDA-only code (the extension compiles with QCOMM_WITH_CUDA=1):
# the same sources compiled again here took minutes (codec_cpu.cpp alone 256 s of one core, -O2,
# when it held the loops of every instruction set).
# Not for the TSan build (instrumented objects), nor with SIMT_REUSE_EXT=0.
NINJA="$(dirname "$PY")/ninja"
EXT_DIR=""
if [[ "${SIMT_TSAN:-0}" != 1 && "${SIMT_REUSE_EXT:-1}" == 1 && -x "$NINJA" ]]; then
  for d in "${QCOMM_BUILD_DIR:-$ROOT/build}"/temp.*; do
    if [[ -f "$d/build.ninja" ]] && grep -qF -- "-I$TORCH/include" "$d/build.ninja"; then
      EXT_DIR="$(cd "$d" && pwd)"
    fi
  done
fi
[[ -n "$EXT_DIR" ]] && LIBS+=(-fopenmp)  # the extension's objects are compiled with -fopenmp
ext_obj() {  # ext_obj SRC: the extension's up-to-date object for SRC, or nothing
  local src="$1" o state cuda
  [[ -n "$EXT_DIR" && "$src" == csrc/*.cpp ]] || return 0
  o="$EXT_DIR/${src%.cpp}.o"
  [[ -f "$o" ]] || return 0
  state="$("$NINJA" -C "$EXT_DIR" -n "$o" 2>/dev/null || true)"
  [[ "$state" == *"no work to do"* ]] || return 0
  # the source and every header of this checkout ninja recorded for it
  cuda="$("$NINJA" -C "$EXT_DIR" -t deps "$o" |
    awk -v c="$ROOT/csrc/" 'NR > 1 && index($1, c) == 1 {print $1}' |
    xargs -r grep -l QCOMM_WITH_CUDA "$src" 2>/dev/null || true)"
  [[ -z "$cuda" ]] && echo "$o"
  return 0
}

obj() {  # obj OUT SRC [flags...]: compile unless OUT is newer than every source it may include
  local out="$1" src="$2" ext
  shift 2
  ext="$(ext_obj "$src")"
  if [[ -n "$ext" ]]; then
    ln -sfn "$ext" "$out"
    return 0
  fi
  [[ -L "$out" ]] && rm -f "$out"  # a link to an extension object that is now stale
  if [[ ! -f "$out" ]] || [[ -n "$(find csrc tests/native -newer "$out" -print -quit)" ]]; then
    "$CXX" "${FLAGS[@]}" "$@" -c "$src" -o "$out.tmp.$$" && mv "$out.tmp.$$" "$out"
  fi
}
# objects compile in the background, SIMT_JOBS (default: the cores) at once; joined before a link
JOBS="${SIMT_JOBS:-$(nproc)}"
PIDS=()
bg_obj() {
  obj "$@" &
  PIDS+=("$!")
  if ((${#PIDS[@]} >= JOBS)); then
    wait "${PIDS[0]}"
    PIDS=("${PIDS[@]:1}")
  fi
}
joined() {  # waits for every background compile; a failed one fails the script
  local p
  for p in "${PIDS[@]}"; do wait "$p"; done
  PIDS=()
}

bg_obj "$OUTDIR/simt.o" tests/native/simt/simt.cpp "${EMU[@]}"
# the CPU codec: its threading and dispatch, and its loops once per instruction set
CODEC_OBJS=()
for f in codec_cpu codec_cpu_generic codec_cpu_avx2 codec_cpu_avx512; do
  bg_obj "$OUTDIR/$f.o" "csrc/codec/$f.cpp"
  CODEC_OBJS+=("$OUTDIR/$f.o")
done
bg_obj "$OUTDIR/settings.o" csrc/common/settings.cpp

# the emulator's own test: scripts/simt_check.sh self [ok|divergent|...]
if [[ "$WHAT" == self ]]; then
  bg_obj "$OUTDIR/selftest.o" tests/native/simt/selftest.cu "${KERNEL[@]}"
  joined
  "$CXX" "$OUTDIR/selftest.o" "$OUTDIR/simt.o" "${LIBS[@]}" -o "$OUTDIR/simt_selftest"
  exec "$OUTDIR/simt_selftest" "$@"
fi
if [[ "$WHAT" == codec || "$WHAT" == all ]]; then
  bg_obj "$OUTDIR/codec_kernels.o" csrc/cuda/codec_kernels.cu "${KERNEL[@]}"
  bg_obj "$OUTDIR/codec_main.o" tests/native/simt/codec_main.cpp
  joined
  "$CXX" "$OUTDIR/codec_main.o" "$OUTDIR/codec_kernels.o" "${CODEC_OBJS[@]}" \
    "$OUTDIR/settings.o" "$OUTDIR/simt.o" "${LIBS[@]}" -o "$OUTDIR/simt_codec"
  "$OUTDIR/simt_codec" "$@"
fi
# the schedules (csrc/algo) with the CUDA codec operations over the kernels run here, their
# exchanges through the CUDA-IPC copy schedule on host buffers: scripts/simt_check.sh schedules DIR
# (DIR/cases.txt and its inputs: tests/native/simt/schedule_main.cpp; run by
# tests/cuda/test_simt_schedules.py)
if [[ "$WHAT" == schedules ]]; then
  bg_obj "$OUTDIR/codec_kernels.o" csrc/cuda/codec_kernels.cu "${KERNEL[@]}"
  bg_obj "$OUTDIR/cuda_codec_ops.o" csrc/cuda/cuda_codec_ops.cpp -DQCOMM_WITH_CUDA=1
  objs=()
  for f in algo/gather algo/ring algo/run algo/scratch algo/semi_ring algo/two_step plan/plan \
    plan/config plan/tuning codec/codec_ops testing/ipc_emulation cuda/ipc_layout; do
    bg_obj "$OUTDIR/${f#*/}.o" "csrc/$f.cpp"
    objs+=("$OUTDIR/${f#*/}.o")
  done
  bg_obj "$OUTDIR/schedule_main.o" tests/native/simt/schedule_main.cpp
  joined
  "$CXX" "$OUTDIR/schedule_main.o" "${objs[@]}" "$OUTDIR/cuda_codec_ops.o" \
    "$OUTDIR/codec_kernels.o" "${CODEC_OBJS[@]}" "$OUTDIR/settings.o" "$OUTDIR/simt.o" \
    "${LIBS[@]}" -o "$OUTDIR/simt_schedules"
  exec "$OUTDIR/simt_schedules" "$@"
fi
if [[ "$WHAT" == exchange || "$WHAT" == all ]]; then
  bg_obj "$OUTDIR/ipc_kernels.o" csrc/cuda/ipc_kernels.cu "${KERNEL[@]}"
  for f in testing/ipc_emulation cuda/ipc_layout; do bg_obj "$OUTDIR/${f#*/}.o" "csrc/$f.cpp"; done
  bg_obj "$OUTDIR/exchange_main.o" tests/native/simt/exchange_main.cpp
  joined
  "$CXX" "$OUTDIR/exchange_main.o" "$OUTDIR/ipc_kernels.o" "$OUTDIR/ipc_emulation.o" \
    "$OUTDIR/ipc_layout.o" "$OUTDIR/simt.o" "${LIBS[@]}" -o "$OUTDIR/simt_exchange"
  "$OUTDIR/simt_exchange" "$@"
fi
