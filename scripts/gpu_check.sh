#!/usr/bin/env bash
# The GPU check: one call on a GPU machine (the device tool), under 8 minutes. Builds the CUDA
# extension, runs the GPU tests and the CPU codec tests, benchmarks the CUDA codec kernels, and
# writes logs and CSV under $OUT (default out/gpu_check). Uses the machine's python with torch
# preinstalled (no network there); prints a short table last.
#
# Covered today: the codec kernels (csrc/cuda/) bit for bit against the CPU codec, their
# throughput against device-to-device copy; the collective (NCCL) path of the algorithms
# (csrc/collective_algos.*) at world size 1 against its CPU run. Not yet built (issue 3): that path
# wired into allreduce, the CUDA-IPC fused two_step, NCCL-like streams and Work, CUDA-graph capture, and the
# multi-rank GPU tests; until then qnccl passes CUDA allreduces through to NCCL exactly.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/out/gpu_check}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
status=0
step() { printf '\n== %s\n' "$*" | tee -a "$OUT/summary.txt"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/summary.txt"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/summary.txt"

step "build (QCOMM_CUDA=1)"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export QCOMM_CUDA_ARCHS="${QCOMM_CUDA_ARCHS:-90}"  # the H200 only: halves nvcc time there
START=$(date +%s)
if QCOMM_CUDA=1 MAX_JOBS="${MAX_JOBS:-16}" timeout 300 "$PY" setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1; then
  echo "build ok ($(( $(date +%s) - START )) s)" | tee -a "$OUT/summary.txt"
else
  echo "BUILD FAILED (tail of build.log):" | tee -a "$OUT/summary.txt"
  tail -30 "$OUT/build.log" | tee -a "$OUT/summary.txt"
  exit 1
fi

step "tests: build, CUDA codec vs CPU, CPU codec, collective path on CUDA vs CPU"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider tests/test_build.py tests/test_cuda_codec.py \
  tests/test_codec.py tests/test_collective_algos.py::test_cuda_world1_equals_cpu \
  tests/test_collective_algos.py::test_cuda_codec_ops_hop_equals_cpu 2>&1 | tee "$OUT/tests.log" | tail -5 | tee -a "$OUT/summary.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

step "CUDA codec kernels vs device-to-device copy"
timeout 120 "$PY" benchmarks/cuda_codec_bench.py --csv "$OUT/codec_kernels.csv" 2>&1 | tee "$OUT/bench.txt" \
  | tee -a "$OUT/summary.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

step "CUDA IPC probe: two processes ping-pong a flag on one GPU"
if "$PY" -c "import cupy" 2>/dev/null; then
  timeout 150 "$PY" benchmarks/ipc_probe.py --rounds 200 2>&1 | tee "$OUT/ipc_probe.txt" | tee -a "$OUT/summary.txt"
else
  echo "cupy missing: probe skipped" | tee -a "$OUT/summary.txt"
fi

step "Megatron-core example on the GPU (qnccl over NCCL, TP=1) and on CPU ranks (TP=2)"
if "$PY" -c "import megatron.core" 2>/dev/null; then
  timeout 120 torchrun --nproc_per_node 1 examples/megatron_tp.py --bits 8/8 2>&1 | tail -8 \
    | tee "$OUT/megatron_gpu.txt" | tee -a "$OUT/summary.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  timeout 120 torchrun --nproc_per_node 2 examples/megatron_tp.py --cpu --bits 8/8 2>&1 | tail -8 \
    | tee "$OUT/megatron_cpu.txt" | tee -a "$OUT/summary.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
  echo "megatron-core is not installed here (no network): skipped; carry its wheel in .whl to run it" \
    | tee -a "$OUT/summary.txt"
fi

step "result: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
