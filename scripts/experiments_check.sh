#!/usr/bin/env bash
# The experiments' check (csrc/experiments/README.md): what only a QCOMM_EXPERIMENTS=1 build has,
# none of it part of the default build or of the default test command. Today that is the fused
# CUDA-IPC two_step kernel (csrc/experiments/ipc_fused/). No GPU needed.
#
#     bash scripts/experiments_check.sh           # everything below, in this order:
#       1. build: a scratch copy of the tree (EXPERIMENTS_DIR, default /tmp/qcomm-experiments;
#          kept, so a second run rebuilds only what changed) built CPU-only with
#          QCOMM_EXPERIMENTS=1 (the fused kernel's host emulation and test hooks);
#       2. nvcc: the fused kernel's .cu compiled by nvcc for sm_90 (QCOMM_CUDA_ARCHS) with
#          setup.py's flags, as a CUDA build would (no GPU needed);
#       3. pytest tests/experiments against that build (its GPU tests skip without a GPU). Its
#          tests run the two steps below through this script: the fused kernel under the SIMT
#          emulator (simt, and simt --quick under ThreadSanitizer) and the TSan harness (tsan).
#     bash scripts/experiments_check.sh build | nvcc | pytest [pytest args]   # one step
#     bash scripts/experiments_check.sh simt [--quick]   # the fused kernel's own source run by the
#       SIMT emulator (tests/experiments/native/fused_simt_main.cpp: W ranks x B blocks against
#       the host emulation, bit for bit; then a rank that never comes); SIMT_TSAN=1: under
#       ThreadSanitizer (the flags of scripts/simt_check.sh)
#     bash scripts/experiments_check.sh tsan   # ThreadSanitizer over the fused protocol's host
#       emulation (tests/experiments/native/fused_race.cpp: 4 ranks x 3 blocks, several pieces
#       and calls)
# Exits non-zero on the first failure. CUDA_HOME (default /usr/local/cuda) must hold the
# toolkit's headers (and nvcc for step 2); PYTHON defaults to the repository's .venv.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
WHAT="${1:-all}"
shift || true
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
WORK="${EXPERIMENTS_DIR:-/tmp/qcomm-experiments}"
cd "$ROOT"
say() { echo "[experiments] $*" >&2; }

build() {
  mkdir -p "$WORK"
  say "building $WORK with QCOMM_EXPERIMENTS=1 (CPU-only)"
  if command -v rsync >/dev/null; then
    # changed files get a fresh mtime (-c), so ninja rebuilds them; build outputs stay
    rsync -rlpc --delete --exclude .venv --exclude build --exclude '*.so' --exclude .git \
      --exclude __pycache__ --exclude out "$ROOT/" "$WORK/"
  else
    git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$WORK"
  fi
  (cd "$WORK" && PATH="$(dirname "$PY"):$PATH" QCOMM_CUDA=0 QCOMM_EXPERIMENTS=1 QCOMM_TEST_HOOKS=1 \
    MAX_JOBS="${MAX_JOBS:-2}" "$PY" setup.py -q build_ext --inplace >build.log 2>&1) \
    || { tail -40 "$WORK/build.log"; exit 1; }
  (cd "$WORK" && PYTHONPATH="$WORK" "$PY" -c \
    'import qcomm, sys; sys.exit(0 if qcomm._C.compiled_with_experiments() else 1)') \
    || { say "the build in $WORK has no experiments"; exit 1; }
  say "built"
}

nvcc_check() {
  local nvcc="${NVCC:-$CUDA_HOME/bin/nvcc}" tmp a gencode=()
  [ -x "$nvcc" ] || { say "no nvcc at $nvcc (set CUDA_HOME or NVCC)"; exit 2; }
  IFS=';' read -ra archs <<<"${QCOMM_CUDA_ARCHS:-90}"
  for a in "${archs[@]}"; do [ -n "$a" ] && gencode+=("-gencode=arch=compute_$a,code=sm_$a"); done
  tmp="$(mktemp -d)"
  for cu in csrc/experiments/*/*.cu; do
    # setup.py's nvcc flags, and its marks of a CUDA experiments build
    "$nvcc" -O3 -std=c++17 -fmad=false --prec-div=true --prec-sqrt=true "${gencode[@]}" \
      -DQCOMM_WITH_CUDA=1 -DQCOMM_EXPERIMENTS=1 -Icsrc -c "$cu" -o "$tmp/kernel.o"
    say "nvcc ${archs[*]}: $cu compiles ($(stat -c %s "$tmp/kernel.o") bytes of object)"
  done
  rm -rf "$tmp"
}

run_pytest() {
  [ -f "$WORK/setup.py" ] || build
  say "pytest tests/experiments (against $WORK)"
  (cd "$WORK" && PYTHONPATH="$WORK" PYTHON="$PY" "$PY" -m pytest -q -p no:cacheprovider \
    tests/experiments "$@")
}

# The SIMT emulator and ThreadSanitizer builds: host C++ against torch's libraries.
TORCH="$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
# shellcheck disable=SC2054  # -Wl,-rpath,DIR is one argument
LIBS=(-L "$TORCH/lib" -Wl,-rpath,"$TORCH/lib" -ltorch_cpu -lc10 -lpthread)

simt() {
  [[ -f "$CUDA_HOME/include/cuda_runtime.h" ]] || { say "no CUDA headers at $CUDA_HOME"; exit 3; }
  # scripts/simt_check.sh's flags: the kernels as host C++ with the emulator forced in, a
  # misaligned vector access aborting under UBSan's alignment check, the emulator's runtime never
  # instrumented
  local out="${QCOMM_SIMT_DIR:-/tmp/qcomm-simt}-experiments" cxx="${CXX_SIMT:-g++}"
  local flags=(-std=c++17 -O2 -g -ffp-contract=off -fno-strict-aliasing -D_GLIBCXX_USE_CXX11_ABI=1
    -DQCOMM_EXPERIMENTS=1 -I csrc -I "$CUDA_HOME/include" -I "$TORCH/include")
  local libs=("${LIBS[@]}" -fsanitize=alignment)
  local kernel=(-x c++ -include tests/native/simt/simt.h -fsanitize=alignment
    -fno-sanitize-recover=alignment)
  local emu=()
  if [[ "${SIMT_TSAN:-0}" == 1 ]]; then
    out="$out-tsan"
    flags+=(-fsanitize=thread -fno-omit-frame-pointer)
    libs+=(-fsanitize=thread)
    emu=(-fno-sanitize=thread -DQCOMM_SIMT_TSAN=1)
    export TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}"
  fi
  mkdir -p "$out"
  obj() {  # obj OUT SRC [flags...]: compile unless OUT is newer than every source it may include
    local o="$1" src="$2"
    shift 2
    if [[ ! -f "$o" ]] || [[ -n "$(find csrc tests/native tests/experiments/native -newer "$o" \
      -print -quit)" ]]; then
      "$cxx" "${flags[@]}" "$@" -c "$src" -o "$o"
    fi
  }
  obj "$out/simt.o" tests/native/simt/simt.cpp "${emu[@]}"
  obj "$out/ipc_two_step.o" csrc/experiments/ipc_fused/ipc_two_step.cu "${kernel[@]}"
  local objs=("$out/ipc_two_step.o" "$out/simt.o") f
  for f in experiments/ipc_fused/fused_host experiments/ipc_fused/fused_layout cuda/ipc_layout \
    plan/plan plan/config plan/tuning codec/codec_cpu codec/codec_cpu_generic codec/codec_cpu_avx2 \
    codec/codec_cpu_avx512 common/settings; do
    obj "$out/${f##*/}.o" "csrc/$f.cpp"
    objs+=("$out/${f##*/}.o")
  done
  obj "$out/fused_simt_main.o" tests/experiments/native/fused_simt_main.cpp
  "$cxx" "$out/fused_simt_main.o" "${objs[@]}" "${libs[@]}" -o "$out/simt_fused"
  "$out/simt_fused" "$@"
}

tsan() {
  local out="${QCOMM_TSAN_DIR:-/tmp/qcomm-tsan}-experiments"
  mkdir -p "$out"
  g++ -std=c++17 -O1 -g -fsanitize=thread -fno-omit-frame-pointer -ffp-contract=off \
    -D_GLIBCXX_USE_CXX11_ABI=1 -DQCOMM_EXPERIMENTS=1 -I csrc -I "$TORCH/include" \
    tests/experiments/native/fused_race.cpp csrc/experiments/ipc_fused/fused_host.cpp \
    csrc/experiments/ipc_fused/fused_layout.cpp csrc/cuda/ipc_layout.cpp \
    csrc/codec/codec_cpu*.cpp csrc/common/settings.cpp csrc/plan/plan.cpp csrc/plan/config.cpp \
    csrc/plan/tuning.cpp \
    "${LIBS[@]}" -o "$out/fused_race"
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" "$out/fused_race"
}

case "$WHAT" in
  all)
    build
    nvcc_check
    run_pytest "$@"
    say "all passed"
    ;;
  build) build ;;
  nvcc) nvcc_check ;;
  pytest) run_pytest "$@" ;;
  simt) simt "$@" ;;
  tsan) tsan ;;
  *)
    say "unknown step '$WHAT' (all, build, nvcc, pytest, simt, tsan)"
    exit 2
    ;;
esac
