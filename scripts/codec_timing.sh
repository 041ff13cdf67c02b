#!/usr/bin/env bash
# Builds benchmarks/cuda/codec_timing.cu (the codec kernels timed without torch) with nvcc alone:
# no GPU needed to build, and no build on the GPU machine, where the binary runs as it is (its CUDA
# runtime is linked statically; it needs the driver only). The nvcc flags are setup.py's. The
# kernels read their launch settings through csrc/common/settings.cpp, compiled and linked too.
#
#     bash scripts/codec_timing.sh            # builds build/codec_timing (sm_90; QCOMM_CUDA_ARCHS)
#     bash scripts/codec_timing.sh --check    # compiles the harness and settings.cpp alone
#                                             # (tests/cuda/test_build.py)
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
  TMP="$(mktemp -d)"
  "$NVCC" "${FLAGS[@]}" -c benchmarks/cuda/codec_timing.cu -o "$TMP/codec_timing.o"
  "$NVCC" "${FLAGS[@]}" -c csrc/common/settings.cpp -o "$TMP/settings.o"
  echo "[codec_timing] the harness compiles ($(stat -c %s "$TMP/codec_timing.o") bytes of object;" \
    "settings.o $(stat -c %s "$TMP/settings.o"))"
  rm -rf "$TMP"
  exit 0
fi
mkdir -p build
echo "[codec_timing] $NVCC (${ARCHS[*]}) -> build/codec_timing"
"$NVCC" "${FLAGS[@]}" benchmarks/cuda/codec_timing.cu csrc/cuda/codec_kernels.cu \
  csrc/common/settings.cpp -o build/codec_timing
echo "[codec_timing] built build/codec_timing"
