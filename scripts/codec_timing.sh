#!/usr/bin/env bash
# Builds benchmarks/cuda/codec_timing.cu (the codec kernels timed without torch) with nvcc alone:
# no GPU needed to build, and no build on the GPU machine, where the binary runs as it is (its CUDA
# runtime is linked statically; it needs the driver only). The nvcc flags are setup.py's.
#
#     bash scripts/codec_timing.sh            # builds build/codec_timing (sm_90; QCOMM_CUDA_ARCHS)
#     bash scripts/codec_timing.sh --check    # compiles the harness alone (tests/test_build.py)
#     build/codec_timing --sizes-mib 64,256   # on the GPU machine
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
NVCC="${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}"
[ -x "$NVCC" ] || { echo "codec_timing: no nvcc at $NVCC (set CUDA_HOME or NVCC)" >&2; exit 2; }
GENCODE=()
IFS=';' read -ra ARCHS <<<"${QCOMM_CUDA_ARCHS:-90}"
for a in "${ARCHS[@]}"; do [ -n "$a" ] && GENCODE+=("-gencode=arch=compute_$a,code=sm_$a"); done
FLAGS=(-O3 -std=c++17 -fmad=false --prec-div=true --prec-sqrt=true "${GENCODE[@]}"
  -DQCOMM_WITH_CUDA=1 -Icsrc)
if [ "${1:-}" = --check ]; then
  OBJ="$(mktemp -d)/codec_timing.o"
  "$NVCC" "${FLAGS[@]}" -c benchmarks/cuda/codec_timing.cu -o "$OBJ"
  echo "[codec_timing] the harness compiles ($(stat -c %s "$OBJ") bytes of object)"
  rm -rf "$(dirname "$OBJ")"
  exit 0
fi
mkdir -p build
echo "[codec_timing] $NVCC (${ARCHS[*]}) -> build/codec_timing"
"$NVCC" "${FLAGS[@]}" benchmarks/cuda/codec_timing.cu csrc/cuda/codec_kernels.cu \
  -o build/codec_timing
echo "[codec_timing] built build/codec_timing"
