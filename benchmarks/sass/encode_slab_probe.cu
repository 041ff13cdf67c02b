// A probe for benchmarks/sass_counts.py: the slab encoder of csrc/cuda/tile_codec.cuh alone, fp32,
// group size fixed at 128 and no noise, so nvcc folds the group-size branches and the SASS is the
// common path (plus the rare paths' out-of-line code). Compiled only by that script, never built
// into the extension.
#include "cuda/tile_codec.cuh"

using qcomm::Noise;
using qcomm::gpu::kSlab;
using qcomm::gpu::SlabTarget;

template <int kBits, bool kSym>
__global__ void __launch_bounds__(256, 3)
    encodeSlabProbe(const float* x, float* meta, uint8_t* data, int64_t groups) {
  constexpr int kVec = 4, kTile = 32 * kVec, kU = kSlab / kTile;
  const int lane = threadIdx.x % 32;
  const int64_t base = (int64_t(blockIdx.x) * 8 + threadIdx.x / 32) * kSlab;
  float v[kU][kVec];
#pragma unroll
  for (int j = 0; j < kU; ++j) qcomm::gpu::loadFloats(x + base + j * kTile + lane * kVec, v[j]);
  const SlabTarget t{meta, data, groups, 7};
  const Noise noise{0, 0, false};
  qcomm::gpu::encodeSlab<kBits, kSym, kVec>(v, base, t, noise);
}

template __global__ void encodeSlabProbe<8, true>(const float*, float*, uint8_t*, int64_t);
template __global__ void encodeSlabProbe<8, false>(const float*, float*, uint8_t*, int64_t);
template __global__ void encodeSlabProbe<4, true>(const float*, float*, uint8_t*, int64_t);
template __global__ void encodeSlabProbe<4, false>(const float*, float*, uint8_t*, int64_t);
