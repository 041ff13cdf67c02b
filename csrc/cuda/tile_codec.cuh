// Vectorised building blocks of the CUDA codec, over csrc/codec.h and warp_codec.cuh: a warp
// encodes a slab of kSlab consecutive elements held in registers (each element read once, with
// 16-byte loads), and a thread decodes 4 consecutive codes into one float4. The per-element math
// is codec.h's, in the same fp32 operations, so the bytes and values equal the scalar paths'.
//
// Slab layout. A slab is kSlab = 1024 consecutive elements starting at a multiple of kSlab, so it
// holds a whole number of groups for every group size (a power of two, 32..1024). Lane l holds,
// for each vector j in [0, kSlab / kTile), the kVec consecutive elements at slab offset
// j * kTile + l * kVec (kTile = 32 * kVec): every load instruction of the warp reads kTile
// contiguous elements. A group of G elements is then either
//   G <= kTile: the vector j of G / kVec consecutive lanes (an aligned lane segment), or
//   G >  kTile: the vectors of G / kTile consecutive j (aligned), across all 32 lanes.
// Since G >= kVec, a lane's vector never straddles two groups.
#pragma once

#include <cuda_runtime.h>

#include "warp_codec.cuh"

namespace qcomm {
namespace gpu {

constexpr int kSlab = 1024;

// codec.h loadParams / storeParams with numGroups(n, c) computed once by the caller: the same
// layout (scale[0..groups), then mid[0..groups) when asymmetric), the same values.
template <bool kSym>
__device__ __forceinline__ GroupParams loadParamsAt(const float* meta, int64_t groups, int64_t g) {
  GroupParams p;
  p.scale = meta[g];
  p.mid = kSym ? 0.0f : meta[groups + g];
  return p;
}

template <bool kSym>
__device__ __forceinline__ void storeParamsAt(float* meta, int64_t groups, int64_t g,
                                              const GroupParams& p) {
  meta[g] = p.scale;
  if (!kSym) meta[groups + g] = p.mid;
}

// Ask L2 for the 128-byte line holding p, without a register or a wait: the grid-stride codec
// kernels prefetch their next slab or step while they work on this one (QCOMM_CUDA_PREFETCH=1),
// so that a warp has two slabs' loads in flight, not one. Only whole slabs or steps inside the
// tensor are prefetched. The emulator ignores it.
__device__ __forceinline__ void prefetchL2(const void* p) {
#if defined(QCOMM_SIMT)
  (void)p;
#else
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

__device__ __forceinline__ bool aligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) & uintptr_t(bytes - 1)) == 0;
}

// Whether the slab layout covers group size `g` with kVec elements per lane and vector.
__host__ __device__ __forceinline__ bool slabGroupSize(int g, int vec) {
  return g >= vec && g <= kSlab && (g & (g - 1)) == 0;
}

template <int kBytes>
struct VecWord;
template <>
struct VecWord<2> {
  using type = uint16_t;
};
template <>
struct VecWord<4> {
  using type = uint32_t;
};
template <>
struct VecWord<8> {
  using type = uint2;
};
template <>
struct VecWord<16> {
  using type = uint4;
};

// v[k] = toFloat(p[k]) for k < kN, read with one access of kN * sizeof(T) bytes (p aligned so).
template <class T, int kN>
__device__ __forceinline__ void loadFloats(const T* p, float (&v)[kN]) {
  using W = typename VecWord<kN* int(sizeof(T))>::type;
  union {
    W w;
    T t[kN];
  } u;
  u.w = *reinterpret_cast<const W*>(p);
#pragma unroll
  for (int k = 0; k < kN; ++k) v[k] = toFloat(u.t[k]);
}

// p[k] = fromFloat<T>(v[k]) for k < kN, written with one access of kN * sizeof(T) bytes.
template <class T, int kN>
__device__ __forceinline__ void storeFloats(T* p, const float (&v)[kN]) {
  using W = typename VecWord<kN* int(sizeof(T))>::type;
  union {
    W w;
    T t[kN];
  } u;
#pragma unroll
  for (int k = 0; k < kN; ++k) u.t[k] = fromFloat<T>(v[k]);
  *reinterpret_cast<W*>(p) = u.w;
}

// The 4 codes of elements e..e+3 (e a multiple of 4) of a data section: one 4-byte (8-bit) or
// 2-byte (4-bit; even element in the low nibble) load.
template <int kBits>
__device__ __forceinline__ void loadCodes4(const uint8_t* data, int64_t e, uint32_t (&q)[4]) {
  if (kBits == 8) {
    const uint32_t w = *reinterpret_cast<const uint32_t*>(data + e);
#pragma unroll
    for (int k = 0; k < 4; ++k) q[k] = (w >> (8 * k)) & 0xffu;
  } else {
    const uint32_t w = *reinterpret_cast<const uint16_t*>(data + e / 2);
#pragma unroll
    for (int k = 0; k < 4; ++k) q[k] = (w >> (4 * k)) & 0xfu;
  }
}

// The codes and parameters of the kN items first, first + stride, ... that are below `items` (item
// i: elements 4i..4i+3 of a data section, one group, since group sizes are multiples of 4; meta
// as loadParamsAt reads it, shift = log2(group size)): every load issued before any is used, so
// that they take one memory round trip together.
template <int kBits, bool kSym, int kN>
__device__ __forceinline__ void loadItems(const uint8_t* data, const float* meta, int64_t groups,
                                          int shift, int64_t first, int64_t stride, int64_t items,
                                          uint32_t (&q)[kN][4], GroupParams (&p)[kN]) {
#pragma unroll
  for (int u = 0; u < kN; ++u) {
    const int64_t i = first + u * stride;
    if (i < items) {
      loadCodes4<kBits>(data, 4 * i, q[u]);
      p[u] = loadParamsAt<kSym>(meta, groups, (4 * i) >> shift);
    }
  }
}

// Store the kVec codes of elements e..e+kVec-1 (e a multiple of kVec) into a data section: one
// access of kVec bytes (8-bit) or kVec / 2 bytes (4-bit, even element in the low nibble).
template <int kBits, int kVec>
__device__ __forceinline__ void storeCodes(uint8_t* data, int64_t e, const uint32_t (&q)[kVec]) {
  static_assert(kVec == 4 || kVec == 8, "kVec");
  constexpr int kPer = 32 / kBits;  // codes per 32-bit word
  constexpr int kWords = (kVec + kPer - 1) / kPer;
  uint32_t w[kWords];
#pragma unroll
  for (int i = 0; i < kWords; ++i) w[i] = 0u;
#pragma unroll
  for (int k = 0; k < kVec; ++k) w[k / kPer] |= q[k] << (kBits * (k % kPer));
  if (kBits == 8) {
    if (kVec == 4) {
      *reinterpret_cast<uint32_t*>(data + e) = w[0];
    } else {
      *reinterpret_cast<uint2*>(data + e) = make_uint2(w[0], w[kWords - 1]);
    }
  } else {
    if (kVec == 4) {
      *reinterpret_cast<uint16_t*>(data + e / 2) = uint16_t(w[0]);
    } else {
      *reinterpret_cast<uint32_t*>(data + e / 2) = w[0];
    }
  }
}

// Where a slab's parameters and codes go.
struct SlabTarget {
  float* meta;     // the encoded block: scale[0..groups), then mid[0..groups) if asymmetric
  uint8_t* data;   // the block's data section
  int64_t groups;  // numGroups(n, c)
  int groupShift;  // log2(groupSize)
};

// Encode the slab of elements base..base+kSlab-1 (all < n) whose values the lanes hold in v (see
// the layout above): the group reductions (min/max/absmax and the non-finite flag, in another
// order than the CPU loop, which they do not notice), then the parameters (paramsFromAbsmax /
// paramsFromMinMax), then each element's code (quantizeScaled / quantizeStochastic /
// zeroScaleCode, as codec.h encodeGroupT decides), stored with wide stores. All 32 lanes call it.
template <int kBits, bool kSym, int kVec>
__device__ __forceinline__ void encodeSlab(const float (&v)[kSlab / (kWarp * kVec)][kVec],
                                           int64_t base, const SlabTarget& t, const Noise& noise) {
  constexpr int kTile = kWarp * kVec;
  constexpr int kU = kSlab / kTile;
  const int lane = threadIdx.x % kWarp;
  const int gs = 1 << t.groupShift;
  const int lanesPerGroup = gs / kVec < kWarp ? gs / kVec : kWarp;
  const int vecsPerGroup = gs > kTile ? gs / kTile : 1;

  // 1. this lane's part of each vector's group: lo = absmax (symmetric) or min, hi = max. fminf
  //    and fmaxf skip a NaN, but a NaN or Inf marks the group bad and then no one reads them
  float lo[kU], hi[kU];
  int bad[kU];
#pragma unroll
  for (int j = 0; j < kU; ++j) {
    bad[j] = 0;
    if (kSym) {
      lo[j] = 0.0f;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        bad[j] |= nonFinite(v[j][k]);
        lo[j] = fmaxf(bitsFloat(floatBits(v[j][k]) & 0x7fffffffu), lo[j]);
      }
      hi[j] = 0.0f;
    } else {
      lo[j] = hi[j] = v[j][0];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float x = v[j][k];
        bad[j] |= nonFinite(x);
        lo[j] = fminf(x, lo[j]);
        hi[j] = fmaxf(x, hi[j]);
      }
    }
  }
  // 2. groups longer than a tile: combine the lane's vectors of one group (aligned runs of
  //    vecsPerGroup vectors); afterwards every vector of the run holds the combination
#pragma unroll
  for (int s = 1; s < kU; s *= 2) {
    if (s < vecsPerGroup) {
#pragma unroll
      for (int j = 0; j < kU; ++j) {
        if ((j & s) == 0) {
          if (kSym) {
            lo[j] = lo[j + s] > lo[j] ? lo[j + s] : lo[j];
            lo[j + s] = lo[j];
          } else {
            lo[j] = lo[j + s] < lo[j] ? lo[j + s] : lo[j];
            hi[j] = hi[j + s] > hi[j] ? hi[j + s] : hi[j];
            lo[j + s] = lo[j];
            hi[j + s] = hi[j];
          }
          bad[j] |= bad[j + s];
          bad[j + s] = bad[j];
        }
      }
    }
  }
  // 3. across the lanes of a group (an aligned segment of lanesPerGroup lanes)
  for (int o = lanesPerGroup / 2; o > 0; o /= 2) {
#pragma unroll
    for (int j = 0; j < kU; ++j) {
      const float l2 = __shfl_xor_sync(0xffffffffu, lo[j], o);
      if (kSym) {
        lo[j] = l2 > lo[j] ? l2 : lo[j];
      } else {
        const float h2 = __shfl_xor_sync(0xffffffffu, hi[j], o);
        lo[j] = l2 < lo[j] ? l2 : lo[j];
        hi[j] = h2 > hi[j] ? h2 : hi[j];
      }
    }
  }
  const uint32_t segment = lanesPerGroup == kWarp
                               ? 0xffffffffu
                               : ((1u << lanesPerGroup) - 1u) << (lane & ~(lanesPerGroup - 1));
#pragma unroll
  for (int j = 0; j < kU; ++j) bad[j] = (__ballot_sync(0xffffffffu, bad[j]) & segment) != 0u;

    // 4. parameters, codes
#pragma unroll
  for (int j = 0; j < kU; ++j) {
    const GroupParams p = kSym ? paramsFromAbsmax(lo[j], bad[j], kBits)
                               : paramsFromMinMax(lo[j], hi[j], bad[j], kBits);
    const int off = j * kTile + lane * kVec;
    const int64_t e = base + off;
    if ((off & (gs - 1)) == 0) storeParamsAt<kSym>(t.meta, t.groups, e >> t.groupShift, p);
    const bool finite = paramsFinite(p);
    const bool constant = finite && p.scale == 0.0f;
    uint32_t q[kVec];
    if (finite && !noise.on && fastScaleRange(p.scale)) {  // the common case, straight-line
      const float rcp = 1.0f / p.scale;
#pragma unroll
      for (int k = 0; k < kVec; ++k) q[k] = quantizeWithReciprocal<kBits, kSym>(v[j][k], p, rcp);
      storeCodes<kBits, kVec>(t.data, e, q);
      continue;
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      if (!finite) {
        q[k] = 0u;
      } else if (constant) {
        q[k] = zeroScaleCode<kBits, kSym>();
      } else if (noise.on) {
        q[k] = quantizeStochastic<kBits, kSym>(v[j][k], p, noiseAt(noise, e + k));
      } else {
        q[k] = quantizeScaled<kBits, kSym>(v[j][k], p);
      }
    }
    storeCodes<kBits, kVec>(t.data, e, q);
  }
}

}  // namespace gpu
}  // namespace qcomm
