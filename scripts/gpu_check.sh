#!/usr/bin/env bash
# The GPU check: one call on a GPU machine, under 8 minutes (the device tool; give it a wall limit
# of about 540 s, so a late step leaves time to pack). Builds the
# CUDA extension, checks that C++ exceptions reach Python, runs the never-run items of PLAN (below),
# then the rest in order of what the call is for, so that what the deadline cuts is the least
# needed:
#   (a) the codec kernels against device-to-device copy (the goal: >= 0.80x of copy bandwidth
#       from 64 MiB up), the default kernels' table first, then the launch variants
#       (QCOMM_CUDA_ENCODE_BLOCKS=4, QCOMM_CUDA_FULL_GRID=1, 4 blocks with the full grid, and the
#       resident grid with 3-block encoders, the default before 2026-11-30);
#   (b) the CUDA-IPC two_step's cost per byte with the separate kernels (2 ranks as threads; with
#       the default buffers and with 128 MiB ones);
#   (c) the CUDA codec kernels bit for bit against the CPU codec;
#   (d) the separate kernels over CUDA IPC, 2 and 4 ranks as processes sharing the GPU, bit for
#       bit against the reference (a message larger than the buffer, streams and Work, a CUDA
#       graph replayed 100 times);
#   (e) the NCCL transport at world size 1;
#   (f) the codec kernels' hardware counters under Nsight Compute, where ncu may read them;
#   (g) the set-up's agreement on settings and calls on different streams, the 4-rank benchmark,
#       the cost model on what this call measured, and the build's tests (SASS counts);
#   (h) under torchrun, qnccl against NCCL's bf16 allreduce, nccl-tests style
#       (benchmarks/allreduce_sweep.py --device cuda: int8, int6 = 4/8, int4; two_step and ring
#       over IPC and over NCCL; speed-up, error, the cost model's prediction, PNGs; CUDA
#       allreduces are not tuned). With 2+ GPUs one rank a GPU; with one GPU 2 ranks share it,
#       IPC only, and the summary says that the cross-GPU part needs 2+ GPUs. Optional, in what
#       is left: with the default DEADLINE the steps before may leave it nothing, so on a machine
#       not held to 8 minutes give it room (DEADLINE=700; QUICK=1 also frees time).
# EXPERIMENTS=1 builds with QCOMM_EXPERIMENTS=1 and adds the fused two_step experiment
# (csrc/experiments/ipc_fused/): its benchmark in (b) and a table beside the separate kernels',
# its tests (tests/experiments/test_ipc_fused.py) in (d), and in (g) where its time goes (one
# profiled run), its time in three launch shapes (tile sizes, task-group sizes), its tests at the
# other shapes and at the set-up, its 4-rank benchmark and its cost model. A default run has no
# fused step: the fused kernel is not in a default build.
# Logs and CSV go under $OUT (default out/gpu_check). Uses the machine's python with torch
# preinstalled (no network there); prints a table of the steps last.
#
# Time plan: PLAN below (bash scripts/gpu_check.sh --dry-run prints it): right after the build,
# one capped step per item that has never run on a GPU, the caps adding up to DEADLINE (475 s);
# then (a)-(h) in what is left, each under its cap (cut to what is left before DEADLINE, skipped
# with under 15 s left), so the last step ends by DEADLINE + 10 s (485 s), under the 540 s wall
# limit with ~50 s for the table and packing. (c) runs the codec tests (146 s at 106b711); (d) the
# IPC tests the plan did not run; (e), the NCCL transport at world size 1, is in the plan.
#
# The device tool brings back at most 8 files from $OUT: logs and intermediate CSVs are written
# to a scratch folder, so $OUT never holds more than the KEEP files, and on exit they (and any
# other file found in $OUT) are packed into $OUT/details.tar.gz. The result line says PASS, FAIL
# (exit 1), or INCOMPLETE (deadline) (exit 2: nothing failed, but a counted step was cut or
# skipped at the deadline).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1

# The plan (docs/testing.md, "The GPU check"): after the build, first what has never run on a GPU
# (as of 2026-12-03 nothing since 106b711 has), one capped pytest a step; then the codec kernels
# and the timings, while time is left before DEADLINE. The planned steps' caps add up to DEADLINE
# (475 s), under the 8 minutes. Caps: about 1.5x the step's estimate from the last GPU runs
# (benchmarks/results/05-gpu-codec-kernels.md; a run_ranks of 2 processes ~10 s to start, 4 ranks
# ~15 s; the build 85-122 s on 2026-11-30, more kernels since). `--dry-run` prints the plan and
# exits.
PLAN=(
  "machine|15|the GPU, torch and the compiler"
  "build|160|the CUDA extension for sm_90"
  "probe|15|a C++ exception reaches Python"
  "rings4|85|ring and semi_ring over CUDA IPC, 4 ranks (raw, 8 and 4 bits, rotated and not)"
  "rotated2|25|two_step rotated over CUDA IPC, 2 ranks"
  "sharded2|25|reduce-scatter and all-gather of CUDA tensors over CUDA IPC, 2 ranks"
  "mismatch|25|a mismatched call: checked (named, group usable) and on the device (NaN, poison)"
  "abort|20|an error before a call's launches stops its peer"
  "graph|25|CUDA graph capture and 100 replays, then eager calls"
  "rounds|45|the multi-round legs: ring over CUDA IPC in 1 MiB buffers, 2 ranks"
  "nccl1|35|the NCCL transport at world size 1 (the rotated kernels' default path)"
)
plan_cap() {  # plan_cap KEY: the planned step's cap in seconds
  local row
  for row in "${PLAN[@]}"; do
    [ "${row%%|*}" = "$1" ] && { row=${row#*|}; echo "${row%%|*}"; return; }
  done
  echo 0
}
if [ "${1:-}" = "--dry-run" ]; then
  total=0 i=0
  echo "planned steps, in order (cap in seconds):"
  for row in "${PLAN[@]}"; do
    key=${row%%|*} rest=${row#*|}
    i=$((i + 1)) total=$((total + ${rest%%|*}))
    printf '%2d. %-9s %4s  %s\n' "$i" "$key" "${rest%%|*}" "${rest#*|}"
  done
  echo "total of the caps: $total s (DEADLINE ${DEADLINE:-475} s)"
  echo "then, while time is left before DEADLINE (each capped, skipped past it): the codec"
  echo "kernels' timings (60), the two_step IPC bench (40, 40), the codec kernels' tests (160),"
  echo "the other IPC tests (150), ncu (75), set-up agreement (150), the 4-rank bench (45), the"
  echo "cost model (30), the build's tests (60), the allreduce sweep (optional)"
  exit 0
fi
OUT="${OUT:-$ROOT/out/gpu_check}"
mkdir -p "$OUT"
LOGS="$(mktemp -d "${TMPDIR:-/tmp}/qcomm_gpu_check.XXXXXX")"
KEEP='summary.txt|codec_kernels.csv|codec_variants.csv|fused_two_step.csv|separate_two_step.csv'
KEEP+='|fused_shapes.csv|ncu_codec.txt|details.tar.gz'
(IFS='|' && for f in $KEEP; do rm -f "${OUT:?}/$f"; done)  # nothing of an earlier run is read
# shellcheck disable=SC2317  # pack runs from the EXIT trap
pack() {  # on every exit, a failed build's too: at most 8 files in $OUT
  local rc=$? f
  if [ -z "${TABLE_DONE:-}" ] && [ -n "${RESULTS+set}" ]; then  # cut short: the steps so far
    {
      # the step that was running: its output so far
      [ -n "${RUNNING:-}" ] && [ -f "$RUNNING" ] && tail -80 "$RUNNING"
      echo "result: cut short (exit $rc); the steps that ran:"
      echo "| step | result | seconds |"
      echo "|---|---|---|"
      printf '%s\n' "${RESULTS[@]}"
      [ -n "${RUNNING:-}" ] && echo "| $CURRENT | cut short while running | - |"
    } >>"$OUT/summary.txt"
  fi
  for f in "$OUT"/* "$OUT"/.[!.]*; do
    [ -e "$f" ] || continue
    [[ "${f##*/}" =~ ^($KEEP)$ ]] || mv "$f" "$LOGS/"
  done
  tar czf "$OUT/details.tar.gz" -C "$LOGS" . && rm -rf "$LOGS"
  exit "$rc"
}
trap pack EXIT
trap 'exit 143' TERM INT HUP  # still packs
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
status=0      # a counted step failed
incomplete=0  # a counted step was cut or skipped at the deadline
CURRENT=""
RESULTS=()
step() {
  CURRENT="$1"
  printf '\n== %s (%s s)\n' "$1" "$SECONDS" | tee -a "$OUT/summary.txt"
}
note() { echo "$*" | tee -a "$OUT/summary.txt"; }

step "machine"
timeout -k 2 5 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  | tee -a "$OUT/summary.txt"
timeout -k 2 10 "$PY" -c \
  "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
  | tee -a "$OUT/summary.txt"
note "CXX=${CXX:-unset}; $(${CXX:-c++} --version 2>/dev/null | head -1)"

# EXPERIMENTS=1: the experiments too (QCOMM_EXPERIMENTS=1; csrc/experiments/README.md)
EXPERIMENTS="${EXPERIMENTS:-0}"
build() {
  # BUILD_CAP: a longer bound for a dry run on a small machine (2 cores take ~5 minutes)
  QCOMM_CUDA=1 QCOMM_EXPERIMENTS="$EXPERIMENTS" QCOMM_TEST_HOOKS=1 MAX_JOBS="${MAX_JOBS:-16}" \
    timeout -k 10 "${BUILD_CAP:-$(plan_cap build)}" "$PY" setup.py -q build_ext --inplace \
    >"$LOGS/build.log" 2>&1
}
step "build (QCOMM_CUDA=1, QCOMM_EXPERIMENTS=$EXPERIMENTS)"
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
  tail -30 "$LOGS/build.log" | tee -a "$OUT/summary.txt"
  note "result: FAIL (the build)"
  exit 1
fi

# A C++ exception thrown from the extension must reach Python as an exception. On this machine's
# image it once crashed the process instead (SIGSEGV in test_codec's invalid-argument test, with
# CXX=/opt/gcc/bin/g++); if it does, rebuild with the system compiler and say so.
probe() {
  timeout -k 5 "$(plan_cap probe)" "$PY" - <<'EOF' 2>&1
import torch, qcomm
try:
    qcomm.codec.encode(torch.randn(10), 6, 128, True)
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
  timeout -k 10 60 "$PY" -c "import torch; print(torch.__config__.show())" 2>&1 \
    | grep -m3 -iE "compiler|gcc" | tee -a "$OUT/summary.txt"
fi
if [ $rc -ne 0 ] && [ -x /usr/bin/g++ ] && [ "${CXX:-}" != /usr/bin/g++ ]; then
  note "exceptions crash this build; rebuilding with CXX=/usr/bin/g++" \
    "($(/usr/bin/g++ --version | head -1))"
  export CXX=/usr/bin/g++
  rm -rf build qcomm/_C*.so
  START=$SECONDS
  build || { note "rebuild failed"; tail -20 "$LOGS/build.log" | tee -a "$OUT/summary.txt"; }
  P=$(probe); rc=$?
  note "after rebuild ($((SECONDS - START)) s): $P (rc=$rc)"
fi

# Every step is bounded, and all of them together by DEADLINE (seconds since the start): a hang
# in one step costs that step, not the whole call (time plan above).
DEADLINE="${DEADLINE:-475}"
budget() {  # budget CAP: the seconds a step may take, or 0 when too little is left
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 15 ]; then
    echo 0
  elif [ "$left" -lt "$1" ]; then
    echo "$left"
  else
    echo "$1"
  fi
}
# run_step CAP LOG CMD...: bounded, logged, counted as a failure when it fails, as incomplete
# when the deadline cut or skipped it; with OPTIONAL=1 (a measurement the machine may not allow,
# or a table of what earlier steps measured, whose failure they already count) neither is counted
run_step() {
  local cap log t fail=FAIL optional=${OPTIONAL:-0}
  cap=$1 log=$2
  shift 2
  [ "$optional" = 1 ] && fail="not available"
  t=$(budget "$cap")
  if [ "$t" -eq 0 ]; then
    note "skipped: the call's deadline (${DEADLINE} s) is near"
    [ "$optional" = 1 ] || incomplete=1
    RESULTS+=("| $CURRENT | skipped (deadline) | 0 |")
    return
  fi
  local t0=$SECONDS rc what=ok own
  own="$LOGS/step_$((${#RESULTS[@]} + 1)).log"
  RUNNING="$own"
  timeout -k 10 "$t" "$@" >"$own" 2>&1
  rc=$?
  RUNNING=""
  cat "$own" >>"$log"
  # the summary keeps a step's tail; a failed or cut step's last 80 lines (its tracebacks)
  if [ "$rc" -eq 0 ]; then tail -15 "$own"; else tail -80 "$own"; fi | tee -a "$OUT/summary.txt"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    if [ "$t" -lt "$cap" ]; then  # its own cap was not reached: the deadline cut it
      what="incomplete (cut at the deadline after $t s)"
      [ "$optional" = 1 ] || incomplete=1
    else
      what="$fail (timed out after $t s)"
      [ "$optional" = 1 ] || status=1
    fi
  elif [ "$rc" -ne 0 ]; then
    what="$fail (exit $rc)"
    [ "$optional" = 1 ] || status=1
  fi
  RESULTS+=("| $CURRENT | $what | $((SECONDS - t0)) |")
}
export QCOMM_IPC_SPIN_TIMEOUT_MS="${QCOMM_IPC_SPIN_TIMEOUT_MS:-20000}"  # fail fast, never hang
export QCOMM_CUDA_QUANTIZE=1  # the quantized CUDA path is opt-in (docs/cuda.md, "The opt-in")
# no tuning unless a step asks for it (QCOMM_TUNE=1 there): `auto` would measure each size class
# first (host tensors only: CUDA tensors are never tuned)
export QCOMM_TUNE=0
# not -q: a step's failures are printed with their tracebacks (short), and kept (run_step)
PYTEST=("$PY" -m pytest -p no:cacheprovider -rs --tb=short)
# QUICK=1: skips (a), (c), (f), the cost model and the build's tests (while iterating)
QUICK="${QUICK:-0}"
# the GPU tests only (-m cuda): their CPU-side counterparts run in CI, not on device time.
# test_cuda_allreduce.py's GPU tests by priority: the set-up's agreement (4 run_ranks) and call
# ordering run in (g); so do, with EXPERIMENTS=1, test_ipc_fused.py's set-up test and its pieces
# test at the launch shapes other than the default's
EXTRA="setup_agrees or different_streams"
SHAPES="pieces and not 4096-8"
FUSED_TESTS=tests/experiments/test_ipc_fused.py
ALLREDUCE_TESTS=tests/cuda/test_cuda_allreduce.py

# ---- first, what has never run on a GPU: one pytest per item, each under its planned cap
planned() {  # planned KEY PYTEST_ARGS...: the step of the plan named KEY
  local key=$1 row
  shift
  for row in "${PLAN[@]}"; do
    [ "${row%%|*}" = "$key" ] && step "new: ${row##*|}"
  done
  run_step "$(plan_cap "$key")" "$LOGS/tests.log" "${PYTEST[@]}" "$@"
}
planned rings4 -m cuda -k "rings_match and (4-ring-32 or 4-semi_ring-32)" "$ALLREDUCE_TESTS"
planned rotated2 -m cuda -k "rotated_matches and 2" "$ALLREDUCE_TESTS"
planned sharded2 -m cuda -k "reduce_scatter_and_all_gather and 2" "$ALLREDUCE_TESTS"
planned mismatch -m cuda -k "streams_work_and_errors" "$ALLREDUCE_TESTS"
planned abort -m cuda -k "error_before_the_launches" "$ALLREDUCE_TESTS"
planned graph -m cuda -k "cuda_graph" "$ALLREDUCE_TESTS"
planned rounds -m cuda -k "rings_match and 2-ring-1" "$ALLREDUCE_TESTS"
planned nccl1 -m cuda tests/algo/test_collective_algos.py

# ---- (a) the codec kernels' throughput: the default table, then the variants (codec_variants.csv)
if [ "$QUICK" != 1 ]; then
  step "CUDA codec kernels vs device-to-device copy (then the launch variants)"
  run_step 60 "$LOGS/bench.txt" "$PY" benchmarks/cuda_codec_bench.py \
    --csv "$OUT/codec_kernels.csv" --variants-csv "$OUT/codec_variants.csv"
fi

# ---- (b) the two_step's cost per byte, the separate kernels (and with EXPERIMENTS=1 the fused
# kernel, and the two side by side) (ranks as threads of one process: the benchmark gives each
# rank's stream a hardware queue, CUDA_DEVICE_MAX_CONNECTIONS=32 unless set)
if [ "$EXPERIMENTS" = 1 ]; then
  step "fused CUDA-IPC two_step (experiment), 2 ranks as threads on the one GPU"
  run_step 40 "$LOGS/ipc_bench.txt" env QCOMM_IPC_SPIN_TIMEOUT_MS=5000 \
    "$PY" benchmarks/ipc_two_step_bench.py --world 2 --kernels fused \
    --sizes-mib 16,64,256 --csv "$OUT/fused_two_step.csv"
fi

step "separate kernels over CUDA IPC, 2 ranks as threads on the one GPU"
run_step 40 "$LOGS/ipc_bench.txt" env QCOMM_IPC_SPIN_TIMEOUT_MS=5000 \
  "$PY" benchmarks/ipc_two_step_bench.py --world 2 --kernels separate \
  --sizes-mib 16,64,256 --csv "$OUT/separate_two_step.csv"

# the separate kernels with a buffer 4x the default: a rank's slot of 64 MiB of fp32 at 8 bits
# (8.5 MiB with 2 ranks; qcomm.codec.encoded_bytes) is over the default buffer's round
# (8 MiB), so it takes two rounds and is copied out of the buffer; with 128 MiB it takes one
# round, read where it landed
step "separate kernels over CUDA IPC, 2 ranks, 128 MiB buffers (one round where 32 take two)"
run_step 40 "$LOGS/ipc_bench.txt" env QCOMM_IPC_SPIN_TIMEOUT_MS=5000 QCOMM_IPC_BUFFER_MB=128 \
  "$PY" benchmarks/ipc_two_step_bench.py --world 2 --kernels separate \
  --sizes-mib 16,64,256 --csv "$LOGS/separate_buffer128.csv"

if [ "$EXPERIMENTS" = 1 ]; then
step "the fused kernel and the separate kernels side by side (2 ranks, this call)"
OPTIONAL=1 run_step 5 "$LOGS/ipc_bench.txt" "$PY" - "$OUT" "$LOGS" <<'EOF'
import csv, os, sys
rows = {}
for kind, path in (
    ("fused", os.path.join(sys.argv[1], "fused_two_step.csv")),
    ("separate", os.path.join(sys.argv[1], "separate_two_step.csv")),
    ("buffer128", os.path.join(sys.argv[2], "separate_buffer128.csv")),
):
    if os.path.exists(path):
        for r in csv.DictReader(open(path)):
            rows.setdefault((int(r["MiB"]), r["bits"]), {})[kind] = float(r["time_us"])
both = {k: v for k, v in rows.items() if "fused" in v and "separate" in v}
if not both:
    sys.exit("no pair of results")
print("| MiB/rank | bits | fused us | separate us | fused / separate"
      " | separate, 128 MiB buffers us |")
print("|---|---|---|---|---|---|")
for (mib, bits), v in sorted(both.items()):
    big = f"{v['buffer128']:.1f}" if "buffer128" in v else "-"
    print(f"| {mib} | {bits} | {v['fused']:.1f} | {v['separate']:.1f} | "
          f"{v['fused'] / v['separate']:.2f} | {big} |")
print("(one rank's share of the chip's time, as the cost model reads it; > 1: separate is faster;"
      " buffers of 32 MiB but in the last column)")
EOF
fi

# ---- (c) the codec kernels bit for bit
if [ "$QUICK" != 1 ]; then
  step "tests: CUDA codec kernels bit for bit against the CPU codec"
  run_step 160 "$LOGS/tests.log" "${PYTEST[@]}" tests/cuda/test_cuda_codec.py
fi

# ---- (d) the CUDA-IPC transport bit for bit: the separate kernels (then the fused kernel)
step "tests: the other IPC tests (two_step matrix, rounds, the rest of the rings, mixed calls)"
PLANNED="4-ring-32 or 4-semi_ring-32 or (rotated_matches and 2) or streams_work_and_errors"
PLANNED+=" or error_before_the_launches or cuda_graph or 2-ring-1"
run_step 150 "$LOGS/tests.log" "${PYTEST[@]}" -m cuda -k "not ($EXTRA) and not ($PLANNED)" \
  "$ALLREDUCE_TESTS"

if [ "$EXPERIMENTS" = 1 ]; then
  step "tests: the fused CUDA-IPC two_step (experiment), 2 and 4 ranks sharing the GPU"
  run_step 110 "$LOGS/tests.log" "${PYTEST[@]}" -m cuda -k "not setup_agrees and not ($SHAPES)" \
    "$FUSED_TESTS"
fi

# ---- (e) the NCCL transport at world size 1: in the plan above

# ---- (f) why the codec kernels run at the speed they do: each one's duration alone, DRAM
# throughput, occupancy and warp stalls from the hardware counters (Nsight Compute; ncu read them
# on this workplace's Firecracker machines and not on gVisor ones, so this may be unavailable)
if [ "$QUICK" != 1 ]; then
  step "ncu: the codec kernels' DRAM throughput, occupancy and stalls (64 MiB of fp32)"
  NCU="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)"
  if [ -z "$NCU" ]; then
    note "ncu not found: skipped"
    RESULTS+=("| $CURRENT | not available (no ncu) | 0 |")
  else
    OPTIONAL=1 run_step 75 "$LOGS/ncu.log" "$NCU" --clock-control none --print-units base \
      --csv --page raw --log-file "$LOGS/ncu_raw.csv" --section SpeedOfLight --section Occupancy \
      --section LaunchStats --section WarpStateStats \
      --metrics dram__bytes_read.sum,dram__bytes_write.sum \
      -k 'regex:encodeKernel|decodeKernel|vectorized_elementwise_kernel' \
      "$PY" benchmarks/ncu_codec.py run --mib 64
    step "ncu: the report (ncu_codec.txt)"
    OPTIONAL=1 run_step 15 "$OUT/ncu_codec.txt" "$PY" benchmarks/ncu_codec.py report \
      "$LOGS/ncu_raw.csv" "$LOGS/ncu.log"
  fi
fi

# ---- (g) the rest, as time allows
# With EXPERIMENTS=1: where the fused kernel's time goes (QCOMM_IPC_PROFILE=1), and the launch
# shapes that may cut it: tiles 4x larger (QCOMM_IPC_TILE_ELEMS: a quarter of the flags and
# barriers per byte) and task groups of one warp (QCOMM_IPC_TASK_WARPS: 8 independent groups per
# block, so one group's round trips overlap the others' work).
# The shapes are timed unprofiled: the profile's counters cost far more than the kernel (on
# 2026-11-30, 64 MiB at 8/8: 631 us unprofiled, 21640 us profiled, and 4x fewer tiles ran 3.65x
# faster profiled), so a profiled time compares the profiler's overhead, not the shapes; one
# profiled run at the default shape gives each phase's share.
if [ "$EXPERIMENTS" = 1 ]; then
step "fused CUDA-IPC two_step profiled (each phase's share; its time is the profiler's)"
run_step 30 "$LOGS/ipc_bench.txt" env QCOMM_IPC_SPIN_TIMEOUT_MS=5000 \
  "$PY" benchmarks/ipc_two_step_bench.py --world 2 --kernels fused --sizes-mib 64 --bits 8/8 \
  --profile
shape() {  # shape TILE TASK_WARPS
  step "fused CUDA-IPC two_step, tiles of $1 elements, task groups of $2 warps"
  run_step 30 "$LOGS/ipc_bench.txt" env QCOMM_IPC_SPIN_TIMEOUT_MS=5000 QCOMM_IPC_TILE_ELEMS="$1" \
    QCOMM_IPC_TASK_WARPS="$2" "$PY" benchmarks/ipc_two_step_bench.py --world 2 --kernels fused \
    --sizes-mib 64 --bits 8/8 --csv "$LOGS/fused_shape_tile${1}_tw${2}.csv"
}
# (three runs of about 7 s each)
shape 4096 8
shape 16384 8
shape 4096 1
step "fused CUDA-IPC two_step: the launch shapes side by side (64 MiB, 8/8, 2 ranks)"
OPTIONAL=1 run_step 5 "$LOGS/ipc_bench.txt" "$PY" - "$LOGS" "$OUT" <<'EOF'
import csv, glob, os, re, sys
rows = []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "fused_shape_tile*_tw*.csv"))):
    shape = re.search(r"tile(\d+)_tw(\d+)", path).groups()
    for r in csv.DictReader(open(path)):
        rows.append((float(r["time_us"]) * 2, *(int(g) for g in shape)))  # the rows hold t / W
if not rows:
    sys.exit("no launch-shape results")
base = next((r[0] for r in rows if r[1:] == (4096, 8)), None)
print("| tile | task warps | us (both ranks) | x the default |")
print("|---|---|---|---|")
with open(os.path.join(sys.argv[2], "fused_shapes.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["tile_elems", "task_warps", "time_us", "x_default"])
    for t, tile, tw in sorted(rows, key=lambda r: r[1:]):
        x = f"{base / t:.2f}" if base else "-"
        print(f"| {tile} | {tw} | {t:.1f} | {x} |")
        w.writerow([tile, tw, f"{t:.1f}", x])
print("(the default: tiles of 4096, task groups of 8 warps)")
EOF

step "tests: the fused kernel's pieces at the other launch shapes (tiles, task groups)"
run_step 60 "$LOGS/tests.log" "${PYTEST[@]}" -m cuda -k "$SHAPES" "$FUSED_TESTS"
fi

# 5 run_ranks (4 of the agreement test, 1 of the ordering test): ~70 s
step "tests: IPC set-up agreement across ranks, calls on different streams"
run_step 150 "$LOGS/tests.log" "${PYTEST[@]}" -m cuda -k "$EXTRA" tests/cuda/test_cuda_allreduce.py
if [ "$EXPERIMENTS" = 1 ]; then
  # 4 run_ranks: the fused settings, different or invalid on one rank
  step "tests: the fused experiment's settings at the IPC set-up"
  run_step 150 "$LOGS/tests.log" "${PYTEST[@]}" -m cuda -k setup_agrees "$FUSED_TESTS"
fi

KERNELS=(separate)
[ "$EXPERIMENTS" = 1 ] && KERNELS+=(fused)
for kernels in "${KERNELS[@]}"; do
  what="$kernels CUDA-IPC two_step, 4 ranks as threads on the one GPU"
  step "$what (printed, not fed to the model)"
  run_step 45 "$LOGS/ipc_bench.txt" env QCOMM_IPC_SPIN_TIMEOUT_MS=5000 \
    "$PY" benchmarks/ipc_two_step_bench.py --world 4 --sizes-mib 16,64 --kernels "$kernels"
done

step "cost model on these measurements (8 GPUs, NVLink and PCIe)"
if [ "$QUICK" = 1 ]; then
  RESULTS+=("| $CURRENT | skipped (QUICK=1) | 0 |")
elif [ ! -s "$OUT/codec_kernels.csv" ]; then
  note "skipped: no codec CSV (the codec bench wrote none)"
  RESULTS+=("| $CURRENT | skipped (no codec CSV) | 0 |")
else
  for kind in "${KERNELS[@]}"; do
    if [ ! -s "$OUT/${kind}_two_step.csv" ]; then
      note "no ${kind}_two_step.csv: no cost model of it"
      continue
    fi
    ALL="$LOGS/kernels_${kind}.csv"
    cat "$OUT/codec_kernels.csv" >"$ALL"
    tail -n +2 "$OUT/${kind}_two_step.csv" >>"$ALL"
    run_step 30 "$LOGS/cost_model.txt" "$PY" benchmarks/cost_model.py --kernel-csv "$ALL" \
      --sizes-mib 16,64,256 --algorithms two_step --bits 8/8,4/4
  done
fi

# the build's own tests (that the kernels were compiled for sm_90; benchmarks/sass_counts.py,
# static SASS counts that need cuobjdump, not a GPU): last, as nothing here needs this machine
if [ "$QUICK" != 1 ]; then
  step "tests: the build (sm_90 compiled, SASS counts)"
  run_step 60 "$LOGS/tests.log" "${PYTEST[@]}" tests/cuda/test_build.py
fi

# ---- (h) nccl-tests-style: qnccl against NCCL under torchrun (benchmarks/allreduce_sweep.py);
# optional (measurements), in what the deadline leaves. With 2+ GPUs one rank a
# GPU (at most 8): the NCCL baseline, transports ipc and nccl, and the cost model's prediction
# beside each row (link SWEEP_LINK, default nvlink=370; the kernel times (a) measured, else the
# H200's in benchmarks/data). With one GPU, 2 ranks share it: IPC only, no baseline.
# SWEEP_SIZES widens the sizes (the sweep's own default is 1M..1G). Its CSV and PNGs go to the
# details; its table, rendered from the CSV (a cut run's finished rows too), to summary.txt.
SWEEP_SIZES="${SWEEP_SIZES:-1M,16M,256M}"
GPUS=0
probe=$(budget 20)  # past the deadline every step below is skipped anyway
[ "$probe" -gt 0 ] && GPUS=$(timeout -k 5 "$probe" "$PY" -c \
  "import torch; print(torch.cuda.device_count())" 2>/dev/null)
[[ "$GPUS" =~ ^[0-9]+$ ]] || GPUS=0
SWEEP=(benchmarks/allreduce_sweep.py --device cuda --sizes "$SWEEP_SIZES" --bits "8/8,4/8,4/4"
  --algorithms "two_step,ring" --transports "ipc,nccl" --csv "$LOGS/allreduce_sweep.csv"
  --plot-dir '')
if [ "$GPUS" -ge 2 ]; then
  NPROC=$((GPUS < 8 ? GPUS : 8))
  KERNEL_CSV=benchmarks/data/h200_codec_kernels.csv
  [ -s "$OUT/codec_kernels.csv" ] && KERNEL_CSV="$OUT/codec_kernels.csv"
  SWEEP+=(--predict "${SWEEP_LINK:-nvlink=370}" --kernel-csv "$KERNEL_CSV")
  what="$NPROC ranks, one a GPU: against NCCL, over ipc and nccl"
else
  NPROC=2
  what="2 ranks share the GPU, IPC only: the cross-GPU part needs 2+ GPUs"
  [ "$GPUS" -eq 0 ] && what="no GPU found"
fi
step "allreduce sweep under torchrun ($what; $SWEEP_SIZES)"
OPTIONAL=1 run_step 150 "$LOGS/sweep.txt" "$PY" -m torch.distributed.run --standalone \
  --nproc_per_node="$NPROC" "${SWEEP[@]}"
render=$(budget 30)
if [ -s "$LOGS/allreduce_sweep.csv" ] && [ "$render" -gt 0 ]; then
  grep -E '^# (GPU|note|pred)' "$LOGS/sweep.txt" | tee -a "$OUT/summary.txt"
  timeout -k 10 "$render" "$PY" benchmarks/allreduce_sweep.py \
    --from-csv "$LOGS/allreduce_sweep.csv" --plot-dir "$LOGS/sweep" 2>&1 \
    | tee -a "$LOGS/sweep.txt" >>"$OUT/summary.txt"
fi

result=PASS
[ $incomplete -eq 1 ] && result="INCOMPLETE (deadline)"
[ $status -ne 0 ] && result=FAIL
[ $status -ne 0 ] && [ $incomplete -eq 1 ] && result="FAIL, and INCOMPLETE (deadline)"
step "result: $result"
{
  echo "| step | result | seconds |"
  echo "|---|---|---|"
  printf '%s\n' "${RESULTS[@]}"
} | tee -a "$OUT/summary.txt"
TABLE_DONE=1
[ $status -ne 0 ] && exit 1
[ $incomplete -eq 1 ] && exit 2
exit 0
