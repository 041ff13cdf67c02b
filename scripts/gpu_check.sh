#!/usr/bin/env bash
# The GPU check: one call on a GPU machine (the device tool), under 8 minutes. Builds the CUDA
# extension, runs the GPU tests (CUDA codec kernels bit for bit against the CPU codec; the fused
# CUDA-IPC two_step, and the separate kernels over CUDA IPC (QCOMM_IPC_KERNELS=separate), with 2
# and 4 ranks sharing the one GPU, bit for bit against the reference, streams and Work, a CUDA
# graph replayed 100 times, calls on different streams, the set-up's agreement on settings; the
# NCCL transport at world size 1), benchmarks the codec kernels
# against device-to-device copy (also in the launch variants: QCOMM_CUDA_PREFETCH=1,
# QCOMM_CUDA_ENCODE_BLOCKS=4, both, QCOMM_CUDA_ENCODE_STAGED=1; side by side), the fused
# two_step's cost per byte and the separate kernels' side by side (and, profiled, where the fused
# kernel's time goes in five launch shapes: tile sizes, task-group sizes, the old release fence,
# the input prefetch), reads the codec kernels'
# hardware counters with Nsight Compute where ncu may, runs the cost model on what it measured,
# and writes logs and CSV under $OUT (default out/gpu_check). Uses the machine's python with torch
# preinstalled (no network there); prints a short table last.
#
# The device tool brings back at most 8 files from $OUT, so on exit everything but the few files
# read first (KEEP below) is packed into $OUT/details.tar.gz.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/out/gpu_check}"
mkdir -p "$OUT"
KEEP='summary.txt|codec_kernels.csv|codec_variants.csv|fused_two_step.csv|separate_two_step.csv|fused_shapes.csv|ncu_codec.txt|details.tar.gz'
# shellcheck disable=SC2317  # pack runs from the EXIT trap
pack() {  # on every exit, a failed build's too: at most 8 files in $OUT
  local rc=$? f extra=()
  for f in "$OUT"/* "$OUT"/.[!.]*; do
    [ -e "$f" ] || continue
    f=${f##*/}
    [[ "$f" =~ ^($KEEP)$ ]] || extra+=("$f")
  done
  if [ ${#extra[@]} -gt 0 ]; then
    (cd "$OUT" && tar czf details.tar.gz "${extra[@]}" && rm -rf "${extra[@]}")
  fi
  exit "$rc"
}
trap pack EXIT
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
# run_step CAP LOG CMD...: bounded, logged, counted as a failure when it fails; with OPTIONAL=1
# (a measurement the machine may not allow) a failure is reported but not counted
run_step() {
  local cap log t fail=FAIL
  cap=$1 log=$2
  shift 2
  [ "${OPTIONAL:-0}" = 1 ] && fail="not available"
  t=$(budget "$cap")
  if [ "$t" -eq 0 ]; then
    note "skipped: the call's deadline (${DEADLINE} s) is near"
    [ "${OPTIONAL:-0}" = 1 ] || status=1
    RESULTS+=("| $CURRENT | skipped (deadline) | 0 |")
    return
  fi
  local t0=$SECONDS rc
  timeout "$t" "$@" 2>&1 | tee -a "$log" | tail -15 | tee -a "$OUT/summary.txt"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || [ "${OPTIONAL:-0}" = 1 ] || status=1
  local what="ok"
  [ "$rc" -eq 0 ] || what="$fail (exit $rc)"
  [ "$rc" -eq 124 ] && what="$fail (timed out after $t s)"
  RESULTS+=("| $CURRENT | $what | $((SECONDS - t0)) |")
}
export QCOMM_IPC_SPIN_TIMEOUT_MS="${QCOMM_IPC_SPIN_TIMEOUT_MS:-20000}"  # fail fast, never hang
export QCOMM_CUDA_QUANTIZE=1  # the quantized CUDA path is opt-in (README, "CUDA tensors")
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -rs)
# QUICK=1: the transport tests and the fused two_step's benchmark only (while iterating)
QUICK="${QUICK:-0}"

if [ "$QUICK" != 1 ]; then
  step "tests: the build, CUDA codec kernels bit for bit against the CPU codec"
  run_step 120 "$OUT/tests.log" "${PYTEST[@]}" tests/test_build.py tests/test_cuda_codec.py

  # and each kernel again in the launch variants (QCOMM_CUDA_PREFETCH=1, QCOMM_CUDA_ENCODE_BLOCKS=4,
  # both, QCOMM_CUDA_ENCODE_STAGED=1), side by side with the default (codec_variants.csv)
  step "CUDA codec kernels vs device-to-device copy (and in the launch variants)"
  run_step 150 "$OUT/bench.txt" "$PY" benchmarks/cuda_codec_bench.py \
    --csv "$OUT/codec_kernels.csv" --variants-csv "$OUT/codec_variants.csv"
fi

# why the codec kernels run at the speed they do: each one's duration alone, DRAM throughput,
# occupancy and warp stalls from the hardware counters (Nsight Compute; ncu read them on this
# workplace's Firecracker machines and not on gVisor ones, so this step may be unavailable)
if [ "$QUICK" != 1 ]; then
  step "ncu: the codec kernels' DRAM throughput, occupancy and stalls (64 MiB of fp32)"
  NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)"
  if [ -z "$NCU" ]; then
    note "ncu not found: skipped"
    RESULTS+=("| $CURRENT | not available (no ncu) | 0 |")
  else
    OPTIONAL=1 run_step 120 "$OUT/ncu.log" "$NCU" --clock-control none --print-units base \
      --csv --page raw --log-file "$OUT/ncu_raw.csv" --section SpeedOfLight --section Occupancy \
      --section LaunchStats --section WarpStateStats \
      --metrics dram__bytes_read.sum,dram__bytes_write.sum \
      -k 'regex:encodeKernel|decodeKernel|vectorized_elementwise_kernel' \
      "$PY" benchmarks/ncu_codec.py run --mib 64
    OPTIONAL=1 run_step 15 "$OUT/ncu_codec.txt" "$PY" benchmarks/ncu_codec.py report \
      "$OUT/ncu_raw.csv" "$OUT/ncu.log"
  fi
fi

# the GPU tests only (-m cuda): their CPU-side counterparts run in CI, not on device time
step "tests: the NCCL transport at world size 1"
run_step 120 "$OUT/tests.log" "${PYTEST[@]}" -m cuda tests/test_collective_algos.py

EXTRA="setup_agrees or different_streams"  # the set-up's agreement, call ordering: run later
step "tests: the fused CUDA-IPC two_step, 2 and 4 ranks sharing the GPU"
run_step 240 "$OUT/tests.log" "${PYTEST[@]}" -m cuda -k "not ($EXTRA) and not separate" \
  tests/test_cuda_allreduce.py

step "tests: the separate kernels over CUDA IPC (QCOMM_IPC_KERNELS=separate), 2 and 4 ranks"
run_step 150 "$OUT/tests.log" "${PYTEST[@]}" -m cuda -k "separate and not ($EXTRA)" \
  tests/test_cuda_allreduce.py

step "fused CUDA-IPC two_step, 2 ranks as threads on the one GPU"
run_step 90 "$OUT/fused.txt" env QCOMM_IPC_SPIN_TIMEOUT_MS=5000 \
  "$PY" benchmarks/ipc_two_step_bench.py --world 2 \
  --sizes-mib 16,64,256 --csv "$OUT/fused_two_step.csv"

step "separate kernels over CUDA IPC, 2 ranks as threads on the one GPU"
run_step 90 "$OUT/fused.txt" env QCOMM_IPC_SPIN_TIMEOUT_MS=5000 \
  "$PY" benchmarks/ipc_two_step_bench.py --world 2 --kernels separate \
  --sizes-mib 16,64,256 --csv "$OUT/separate_two_step.csv"
step "the fused kernel and the separate kernels side by side (2 ranks, this call)"
run_step 15 "$OUT/fused.txt" "$PY" - "$OUT" <<'EOF'
import csv, os, sys
rows = {}
for kind in ("fused", "separate"):
    path = os.path.join(sys.argv[1], f"{kind}_two_step.csv")
    if os.path.exists(path):
        for r in csv.DictReader(open(path)):
            rows.setdefault((int(r["MiB"]), r["bits"]), {})[kind] = float(r["time_us"])
both = {k: v for k, v in rows.items() if len(v) == 2}
if not both:
    sys.exit("no pair of results")
print("| MiB/rank | bits | fused us | separate us | fused / separate |")
print("|---|---|---|---|---|")
for (mib, bits), v in sorted(both.items()):
    print(f"| {mib} | {bits} | {v['fused']:.1f} | {v['separate']:.1f} | "
          f"{v['fused'] / v['separate']:.2f} |")
print("(one rank's share of the chip's time, as the cost model reads it; > 1: separate is faster)")
EOF

# where the fused kernel's time goes (QCOMM_IPC_PROFILE=1), and the launch shapes that may cut it:
# tiles 4x larger (QCOMM_IPC_TILE_ELEMS: a quarter of the flags, fences and barriers per byte)
# and task groups of fewer warps (QCOMM_IPC_TASK_WARPS: 2 or 8 independent groups per block, so
# one group's round trips and fences overlap the others' work)
# and, at tiles of 4096, the release fence the kernel used to issue before every flag
# (QCOMM_IPC_RELEASE_FENCE=1) against the release store alone (the default), and each task group
# asking L2 for the input tile it encodes next (QCOMM_CUDA_PREFETCH=1) against not
shape() {  # shape TILE TASK_WARPS RELEASE_FENCE PREFETCH
  step "fused CUDA-IPC two_step profiled, tiles of $1 elements, task groups of $2 warps, fence $3, prefetch $4"
  local pf=()
  [ "$4" = 1 ] && pf=(QCOMM_CUDA_PREFETCH=1)
  run_step 40 "$OUT/fused.txt" env -u QCOMM_CUDA_PREFETCH "${pf[@]}" \
    QCOMM_IPC_SPIN_TIMEOUT_MS=5000 QCOMM_IPC_TILE_ELEMS=$1 QCOMM_IPC_TASK_WARPS=$2 \
    QCOMM_IPC_RELEASE_FENCE=$3 "$PY" benchmarks/ipc_two_step_bench.py --world 2 --sizes-mib 64 \
    --bits 8/8 --profile --csv "$OUT/fused_shape_tile${1}_tw${2}_rf${3}_pf${4}.csv"
}
# (five runs of about 15 s: the call's deadline leaves no room for more)
shape 4096 8 0 0
shape 16384 8 0 0
shape 4096 1 0 0
shape 4096 8 1 0
shape 4096 8 0 1
step "fused CUDA-IPC two_step: the launch shapes side by side (64 MiB, 8/8, 2 ranks)"
run_step 15 "$OUT/fused.txt" "$PY" - "$OUT" <<'EOF'
import csv, glob, os, re, sys
rows = []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "fused_shape_tile*_tw*_rf*_pf*.csv"))):
    shape = re.search(r"tile(\d+)_tw(\d+)_rf(\d)_pf(\d)", path).groups()
    for r in csv.DictReader(open(path)):
        rows.append((float(r["time_us"]) * 2, *(int(g) for g in shape)))  # the rows hold t / W
if not rows:
    sys.exit("no launch-shape results")
base = next((r[0] for r in rows if r[1:] == (4096, 8, 0, 0)), None)
print("| tile | task warps | release fence | prefetch | us (both ranks) | x the default |")
print("|---|---|---|---|---|---|")
with open(os.path.join(sys.argv[1], "fused_shapes.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["tile_elems", "task_warps", "release_fence", "prefetch", "time_us", "x_default"])
    for t, tile, tw, rf, pf in sorted(rows, key=lambda r: r[1:]):
        x = f"{base / t:.2f}" if base else "-"
        yes = lambda v: "yes" if v else "no"
        print(f"| {tile} | {tw} | {yes(rf)} | {yes(pf)} | {t:.1f} | {x} |")
        w.writerow([tile, tw, rf, pf, f"{t:.1f}", x])
print("(the default: tiles of 4096, task groups of 8 warps, no fence, no prefetch)")
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
  if [ -s "$OUT/separate_two_step.csv" ]; then
    SEP=/tmp/qcomm_kernels_separate.csv
    cat "$OUT/codec_kernels.csv" >"$SEP"
    tail -n +2 "$OUT/separate_two_step.csv" >>"$SEP"
    run_step 30 "$OUT/cost_model.txt" "$PY" benchmarks/cost_model.py --kernel-csv "$SEP" \
      --sizes-mib 16,64,256 --algorithms two_step --bits 8/8,4/4
  fi
fi

step "result: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
{
  echo "| step | result | seconds |"
  echo "|---|---|---|"
  printf '%s\n' "${RESULTS[@]}"
} | tee -a "$OUT/summary.txt"
exit $status
