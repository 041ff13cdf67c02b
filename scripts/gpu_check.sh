#!/usr/bin/env bash
# The GPU check: one call on a GPU machine (the device tool), under 8 minutes. Builds the CUDA
# extension, runs the GPU tests (CUDA codec kernels bit for bit against the CPU codec; the fused
# CUDA-IPC two_step with 2 and 4 ranks sharing the one GPU, bit for bit against the reference,
# streams and Work, a CUDA graph replayed 100 times, calls on different streams, the set-up's
# agreement on settings; the NCCL transport at world size 1), benchmarks the codec kernels
# against device-to-device copy (also with QCOMM_CUDA_PREFETCH=1, side by side) and the fused
# two_step's cost per byte (and, profiled, where its time goes at two tile sizes and three
# task-group sizes, and with the old release fence), runs the cost model on what it measured, and
# writes logs and CSV under $OUT
# (default out/gpu_check). Uses the machine's python with torch preinstalled (no network there);
# prints a short table last.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/out/gpu_check}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
status=0
CURRENT=""
RESULTS=()
step() {
  CURRENT="$1"
  printf '\n== %s (%s s)\n' "$1" "$SECONDS" | tee -a "$OUT/summary.txt"
}
note() { echo "$*" | tee -a "$OUT/summary.txt"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/summary.txt"
note "CXX=${CXX:-unset}; $(${CXX:-c++} --version 2>/dev/null | head -1)"

build() {
  QCOMM_CUDA=1 MAX_JOBS="${MAX_JOBS:-16}" timeout 200 "$PY" setup.py -q build_ext --inplace \
    >"$OUT/build.log" 2>&1
}
step "build (QCOMM_CUDA=1)"
# On the device image CXX is /opt/gcc/bin/g++, with which C++ exceptions thrown by the extension
# crashed the process (2 of 2 calls); build with the system g++ there (the probe below checks).
if [ -z "${QCOMM_KEEP_CXX:-}" ] && [ -x /usr/bin/g++ ] && [ "${CXX:-}" = /opt/gcc/bin/g++ ]; then
  export CXX=/usr/bin/g++
  note "CXX=/usr/bin/g++ (was /opt/gcc/bin/g++; QCOMM_KEEP_CXX=1 keeps it)"
fi
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export QCOMM_CUDA_ARCHS="${QCOMM_CUDA_ARCHS:-90}"  # the H200 only: halves nvcc time there
START=$SECONDS
if build; then
  note "build ok ($((SECONDS - START)) s)"
else
  note "BUILD FAILED (tail of build.log):"
  tail -30 "$OUT/build.log" | tee -a "$OUT/summary.txt"
  exit 1
fi

# A C++ exception thrown from the extension must reach Python as an exception. On this machine's
# image it once crashed the process instead (SIGSEGV in test_codec's invalid-argument test, with
# CXX=/opt/gcc/bin/g++); if it does, rebuild with the system compiler and say so.
probe() {
  "$PY" - <<'EOF' 2>&1
import torch, qcomm
try:
    qcomm._C.codec_encode(torch.randn(10), 6, 128, True)
    print("probe: no exception raised")
except ValueError as e:
    print("probe: ok (ValueError raised)")
EOF
}
step "exception probe"
P=$(probe); rc=$?
note "$P (rc=$rc)"
if [ $rc -ne 0 ]; then  # what the extension and torch were built with, and what they load
  ldd qcomm/_C*.so | grep -E 'stdc|gcc_s|gomp|c10' | tee -a "$OUT/summary.txt"
  strings -a qcomm/_C*.so | grep -m2 "GCC: (" | tee -a "$OUT/summary.txt"
  "$PY" -c "import torch; print(torch.__config__.show())" 2>&1 | grep -m3 -iE "compiler|gcc" \
    | tee -a "$OUT/summary.txt"
fi
if [ $rc -ne 0 ] && [ -x /usr/bin/g++ ] && [ "${CXX:-}" != /usr/bin/g++ ]; then
  note "exceptions crash this build; rebuilding with CXX=/usr/bin/g++ ($(/usr/bin/g++ --version | head -1))"
  export CXX=/usr/bin/g++
  rm -rf build qcomm/_C*.so
  START=$SECONDS
  build || { note "rebuild failed"; tail -20 "$OUT/build.log" | tee -a "$OUT/summary.txt"; }
  P=$(probe); rc=$?
  note "after rebuild ($((SECONDS - START)) s): $P (rc=$rc)"
fi

# Every step is bounded, and all of them together by DEADLINE (seconds since the start): a hang
# in one step costs that step, not the whole call, and the call stays under 8 minutes.
DEADLINE="${DEADLINE:-450}"
budget() {  # budget CAP: the seconds a step may take, or 0 when too little is left
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 15 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
run_step() {  # run_step CAP LOG CMD...: bounded, logged, counted as a failure when it fails
  local cap log t
  cap=$1 log=$2
  shift 2
  t=$(budget "$cap")
  if [ "$t" -eq 0 ]; then
    note "skipped: the call's deadline (${DEADLINE} s) is near"
    status=1
    RESULTS+=("| $CURRENT | skipped (deadline) | 0 |")
    return
  fi
  local t0=$SECONDS rc
  timeout "$t" "$@" 2>&1 | tee -a "$log" | tail -15 | tee -a "$OUT/summary.txt"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || status=1
  local what="ok"
  [ "$rc" -eq 0 ] || what="FAIL (exit $rc)"
  [ "$rc" -eq 124 ] && what="FAIL (timed out after $t s)"
  RESULTS+=("| $CURRENT | $what | $((SECONDS - t0)) |")
}
export QCOMM_IPC_SPIN_TIMEOUT_MS="${QCOMM_IPC_SPIN_TIMEOUT_MS:-20000}"  # fail fast, never hang
export QCOMM_CUDA_QUANTIZE=1  # the quantized CUDA path is opt-in (README, "CUDA tensors")
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -rs)
# QUICK=1: the transport tests and the fused two_step's benchmark only (while iterating)
QUICK="${QUICK:-0}"

if [ "$QUICK" != 1 ]; then
  step "tests: the build, CUDA codec kernels bit for bit against the CPU codec"
  run_step 90 "$OUT/tests.log" "${PYTEST[@]}" tests/test_build.py tests/test_cuda_codec.py

  # and each encode/decode again with QCOMM_CUDA_PREFETCH=1, side by side (codec_prefetch.csv)
  step "CUDA codec kernels vs device-to-device copy (and with QCOMM_CUDA_PREFETCH=1)"
  run_step 150 "$OUT/bench.txt" "$PY" benchmarks/cuda_codec_bench.py \
    --csv "$OUT/codec_kernels.csv" --prefetch-csv "$OUT/codec_prefetch.csv"
fi

# the GPU tests only (-m cuda): their CPU-side counterparts run in CI, not on device time
step "tests: the NCCL transport at world size 1"
run_step 120 "$OUT/tests.log" "${PYTEST[@]}" -m cuda tests/test_collective_algos.py

EXTRA="setup_agrees or different_streams"  # the set-up's agreement, call ordering: run later
step "tests: the fused CUDA-IPC two_step, 2 and 4 ranks sharing the GPU"
run_step 240 "$OUT/tests.log" "${PYTEST[@]}" -m cuda -k "not ($EXTRA)" tests/test_cuda_allreduce.py

step "fused CUDA-IPC two_step, 2 ranks as threads on the one GPU"
run_step 90 "$OUT/fused.txt" env QCOMM_IPC_SPIN_TIMEOUT_MS=5000 \
  "$PY" benchmarks/ipc_two_step_bench.py --world 2 \
  --sizes-mib 16,64,256 --csv "$OUT/fused_two_step.csv"

# where the fused kernel's time goes (QCOMM_IPC_PROFILE=1), and the launch shapes that may cut it:
# tiles 4x larger (QCOMM_IPC_TILE_ELEMS: a quarter of the flags, fences and barriers per byte)
# and task groups of fewer warps (QCOMM_IPC_TASK_WARPS: 2 or 8 independent groups per block, so
# one group's round trips and fences overlap the others' work)
# and, at tiles of 4096, the release fence the kernel used to issue before every flag
# (QCOMM_IPC_RELEASE_FENCE=1) against the release store alone (the default)
shape() {  # shape TILE TASK_WARPS RELEASE_FENCE
  step "fused CUDA-IPC two_step profiled, tiles of $1 elements, task groups of $2 warps, fence $3"
  run_step 40 "$OUT/fused.txt" env QCOMM_IPC_SPIN_TIMEOUT_MS=5000 QCOMM_IPC_TILE_ELEMS=$1 \
    QCOMM_IPC_TASK_WARPS=$2 QCOMM_IPC_RELEASE_FENCE=$3 "$PY" benchmarks/ipc_two_step_bench.py \
    --world 2 --sizes-mib 64 --bits 8/8 --profile --csv "$OUT/fused_shape_tile${1}_tw${2}_rf${3}.csv"
}
for TW in 8 4 1; do
  for TILE in 4096 16384; do shape $TILE $TW 0; done
done
for TW in 8 1; do shape 4096 $TW 1; done
step "fused CUDA-IPC two_step: the launch shapes side by side (64 MiB, 8/8, 2 ranks)"
run_step 15 "$OUT/fused.txt" "$PY" - "$OUT" <<'EOF'
import csv, glob, os, re, sys
rows = []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "fused_shape_tile*_tw*_rf*.csv"))):
    tile, tw, rf = (int(g) for g in re.search(r"tile(\d+)_tw(\d+)_rf(\d)", path).groups())
    for r in csv.DictReader(open(path)):
        rows.append((float(r["time_us"]) * 2, tile, tw, rf))  # the rows hold t / W
if not rows:
    sys.exit("no launch-shape results")
base = next((t for t, tile, tw, rf in rows if (tile, tw, rf) == (4096, 8, 0)), None)
print("| tile | task warps | release fence | us (both ranks) | x the default (4096, 8, no fence) |")
print("|---|---|---|---|---|")
for t, tile, tw, rf in sorted(rows, key=lambda r: r[1:]):
    x = f"{base / t:.2f}" if base else "-"
    print(f"| {tile} | {tw} | {'yes' if rf else 'no'} | {t:.1f} | {x} |")
EOF

step "tests: IPC set-up agreement across ranks, calls on different streams"
run_step 120 "$OUT/tests.log" "${PYTEST[@]}" -m cuda -k "$EXTRA" tests/test_cuda_allreduce.py

step "fused CUDA-IPC two_step, 4 ranks as threads on the one GPU (printed, not fed to the model)"
run_step 60 "$OUT/fused.txt" env QCOMM_IPC_SPIN_TIMEOUT_MS=5000 \
  "$PY" benchmarks/ipc_two_step_bench.py --world 4 --sizes-mib 64

step "cost model on these measurements (8 GPUs, NVLink and PCIe)"
if [ "$QUICK" != 1 ] && [ -s "$OUT/codec_kernels.csv" ]; then
  ALL=/tmp/qcomm_kernels_all.csv
  cat "$OUT/codec_kernels.csv" >"$ALL"
  [ -s "$OUT/fused_two_step.csv" ] && tail -n +2 "$OUT/fused_two_step.csv" >>"$ALL"
  run_step 30 "$OUT/cost_model.txt" "$PY" benchmarks/cost_model.py --kernel-csv "$ALL" \
    --sizes-mib 16,64,256 --algorithms two_step --bits 8/8,4/4
fi

step "result: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
{
  echo "| step | result | seconds |"
  echo "|---|---|---|"
  printf '%s\n' "${RESULTS[@]}"
} | tee -a "$OUT/summary.txt"
exit $status
