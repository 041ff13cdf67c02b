// Vectorised building blocks of the CUDA codec, over csrc/codec/codec.h and warp_codec.cuh: a warp
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

#include <type_traits>

#include "cuda/warp_codec.cuh"

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

// A 16-byte copy from global into shared memory that does not pass through registers (cp.async,
// sm_80 on; L1 bypassed), into the thread's open group; copyAsyncCommit closes the group, and
// copyAsyncWait<k> returns once all but the newest k of the thread's groups are done, their bytes
// then visible to the thread itself (not to other threads: a barrier orders those). Both addresses
// 16-byte aligned. Before sm_80, a plain load and store. The emulator does the copies at the wait
// (simt.h; its self-test runs these). No codec kernel uses them since the staged encoders, timed
// slower on an H200 (benchmarks/results/05), were removed.
__device__ __forceinline__ void copyAsync16(void* shared, const void* global) {
#if defined(QCOMM_SIMT)
  simt::copyAsync(shared, global, 16);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(global) : "memory");
#else
  *static_cast<uint4*>(shared) = *static_cast<const uint4*>(global);
#endif
}

__device__ __forceinline__ void copyAsyncCommit() {
#if defined(QCOMM_SIMT)
  simt::copyAsyncCommit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

template <int kPending>
__device__ __forceinline__ void copyAsyncWait() {
#if defined(QCOMM_SIMT)
  simt::copyAsyncWait(kPending);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

__device__ __forceinline__ bool aligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) & uintptr_t(bytes - 1)) == 0;
}

// Whether the slab layout covers group size `g` with kVec elements per lane and vector: a power
// of two from kWarp (so a group spans at least kSlab / (kWarp * kVec) lanes, as encodeSlab's
// reduce-scatter needs; the codec allows 32..1024) to kSlab.
__host__ __device__ __forceinline__ bool slabGroupSize(int g, int vec) {
  return g >= vec && g >= kWarp && g <= kSlab && (g & (g - 1)) == 0;
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
    } else {
      p[u] = GroupParams{1.0f, 0.0f};  // an item past the end: never used, but defined
    }
  }
}

// dequantizeOne of an item's 4 codes (one group, parameters p), the same values: where
// decodesFinite(p) (the common case, one test per item) clampToFinite is the identity and is
// skipped, a clamp per element fewer.
template <int kBits, bool kSym>
__device__ __forceinline__ void dequantize4(const uint32_t (&q)[4], const GroupParams& p,
                                            float (&v)[4]) {
  if (decodesFinite<kSym>(p)) {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = dequantizeUnclamped<kBits, kSym>(q[k], p);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = dequantizeOne<kBits, kSym>(q[k], p);
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

// NaN-propagating max (PTX max.NaN, sm_80 on): a NaN in either operand gives a NaN, where fmaxf
// returns the other operand. Otherwise the maximum; which zero it gives for -0 and +0 is left
// open, as codec.h's parameters normalise zeros. The emulator (no __CUDA_ARCH__) and code for
// chips before sm_80 compare.
__device__ __forceinline__ float maxNaN(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
#else
  return a != a ? a : (b != b ? b : fmaxf(a, b));
#endif
}

// The statistic a group's parameters come from: its absolute maximum (symmetric; hi unused) or
// its minimum and maximum. The maxima propagate NaN (the minimum need not: the maximum carries
// it), so the group holds a NaN or an Inf exactly when a statistic is not finite, and the
// non-finite flag needs no pass of its own.
struct SlabStat {
  float lo, hi;
};

template <bool kSym>
__device__ __forceinline__ SlabStat combineStats(SlabStat a, SlabStat b) {
  if (kSym) return {maxNaN(a.lo, b.lo), 0.0f};
  return {fminf(a.lo, b.lo), maxNaN(a.hi, b.hi)};
}

template <bool kSym>
__device__ __forceinline__ SlabStat shuffleStat(SlabStat s, int laneMask) {
  SlabStat r;
  r.lo = __shfl_xor_sync(0xffffffffu, s.lo, laneMask);
  r.hi = kSym ? 0.0f : __shfl_xor_sync(0xffffffffu, s.hi, laneMask);
  return r;
}

// Encode the slab of elements base..base+kSlab-1 (all < n) whose values the lanes hold in v (see
// the layout above); group sizes from kWarp (so a group spans at least kU lanes) to kSlab. All 32
// lanes call it.
//   1. Each lane reduces its part of each vector's group (min, max/absmax with NaN), then,
//      for groups longer than a tile, its vectors of one group.
//   2. Reduce-scatter across a group's lanes: at each of the first log2(kU) butterfly levels a
//      lane keeps half of the statistics it carries and swaps the other half with its partner
//      (one shuffle per statistic kept, not per statistic carried); the remaining levels are a
//      plain butterfly. Lane l then holds the whole statistic of vector j(l) = bits of l's offset
//      in its group segment (the lanes of one segment sharing j hold the same).
//   3. Each lane computes the parameters of the group it holds (paramsFromAbsmax /
//      paramsFromMinMax, the reciprocal) once, where every lane used to compute those of all kU
//      vectors; its first holder stores them; every lane then fetches each vector's parameters
//      from a holder with one shuffle per value.
//   4. Each element's code (quantizeWithReciprocal, without its clamp where codec.h
//      asymCodesInRange allows, or quantizeScaled / quantizeStochastic / zeroScaleCode as codec.h
//      encodeGroupT decides), stored with wide stores.
// min, max and the non-finite flag do not depend on the order of reduction, and the parameters
// are codec.h's functions of them, so the bytes are the CPU loop's.
template <int kBits, bool kSym, int kVec>
__device__ __forceinline__ void encodeSlab(const float (&v)[kSlab / (kWarp * kVec)][kVec],
                                           int64_t base, const SlabTarget& t, const Noise& noise) {
  constexpr int kTile = kWarp * kVec;
  constexpr int kU = kSlab / kTile;
  constexpr int kHalvings = kU == 8 ? 3 : (kU == 4 ? 2 : (kU == 2 ? 1 : 0));
  static_assert((1 << kHalvings) == kU, "kU");
  const int lane = threadIdx.x % kWarp;
  const int gs = 1 << t.groupShift;
  const int segShift = gs / kVec < kWarp ? t.groupShift - (__ffs(kVec) - 1) : 5;  // log2 lanes
  const int vecsPerGroup = gs > kTile ? gs / kTile : 1;

  // 1. this lane's part of each vector's group; then its vectors of one group (aligned runs of
  //    vecsPerGroup vectors; afterwards every vector of a run holds the run's statistic)
  SlabStat st[kU];
#pragma unroll
  for (int j = 0; j < kU; ++j) {
    if (kSym) {
      st[j].lo = fabsf(v[j][0]);
#pragma unroll
      for (int k = 1; k < kVec; ++k) st[j].lo = maxNaN(st[j].lo, fabsf(v[j][k]));
      st[j].hi = 0.0f;
    } else {
      st[j].lo = st[j].hi = v[j][0];
#pragma unroll
      for (int k = 1; k < kVec; ++k) {
        st[j].lo = fminf(st[j].lo, v[j][k]);
        st[j].hi = maxNaN(st[j].hi, v[j][k]);
      }
    }
  }
#pragma unroll
  for (int s = 1; s < kU; s *= 2) {
    if (s < vecsPerGroup) {
#pragma unroll
      for (int j = 0; j < kU; ++j) {
        if ((j & s) == 0) st[j] = st[j + s] = combineStats<kSym>(st[j], st[j + s]);
      }
    }
  }

  // 2. reduce-scatter over the segment's lanes (2^segShift >= kU of them, as gs >= kWarp):
  //    halving h at distance o = 2^(segShift - 1 - h); the lanes with that bit set keep the upper
  //    half of the m statistics carried, the others the lower half
#pragma unroll
  for (int h = 0; h < kHalvings; ++h) {
    const int m = kU >> h;
    const int o = 1 << (segShift - 1 - h);
    const bool upper = (lane & o) != 0;
#pragma unroll
    for (int k = 0; k < kU / 2; ++k) {
      if (k < m / 2) {
        const SlabStat send = upper ? st[k] : st[k + m / 2];
        const SlabStat keep = upper ? st[k + m / 2] : st[k];
        st[k] = combineStats<kSym>(keep, shuffleStat<kSym>(send, o));
      }
    }
  }
  for (int o = (1 << (segShift - kHalvings)) / 2; o > 0; o /= 2) {
    st[0] = combineStats<kSym>(st[0], shuffleStat<kSym>(st[0], o));
  }

  // 3. the parameters of the group this lane holds: vector j, segment seg
  const int jShift = segShift - kHalvings;
  const int heldJ = (lane >> jShift) & (kU - 1);
  const int seg = lane >> segShift;
  GroupParams held;
  if (kSym) {
    held = paramsFromAbsmax(st[0].lo, nonFinite(st[0].lo), kBits);
  } else {
    held = paramsFromMinMax(st[0].lo, st[0].hi, nonFinite(st[0].lo) | nonFinite(st[0].hi), kBits);
  }
  const float heldRcp = fastScaleRange(held.scale) ? 1.0f / held.scale : 0.0f;
  // asymmetric: whether the held group's codes need no clamp (codec.h asymCodesInRange, from its
  // minimum and maximum)
  const bool heldInRange = kSym || asymCodesInRange<kBits>(st[0].lo, st[0].hi, held, heldRcp);
  // its first holder stores them: the segment's lowest lane of vector j, and of a run's first j
  if ((lane & ((1 << jShift) - 1)) == 0 && heldJ % vecsPerGroup == 0) {
    const int64_t e = base + heldJ * kTile + (seg << segShift) * kVec;
    storeParamsAt<kSym>(t.meta, t.groups, e >> t.groupShift, held);
  }

  // 4. every vector: its group's parameters from a holder, then the codes. Every group of the
  //    slab has a holder, so when every lane's held group takes the reciprocal path and needs no
  //    clamp (one ballot; the common case) the vectors skip their own tests and the clamp
  const bool allFast = __ballot_sync(0xffffffffu, !noise.on && fastScaleRange(held.scale) &&
                                                      heldInRange) == 0xffffffffu;
  auto fetch = [&](int j, GroupParams& p, float& rcp) {
    const int holder = (seg << segShift) | (j << jShift);
    p.scale = __shfl_sync(0xffffffffu, held.scale, holder);
    p.mid = kSym ? 0.0f : __shfl_sync(0xffffffffu, held.mid, holder);
    rcp = __shfl_sync(0xffffffffu, heldRcp, holder);
  };
  // the codes of vector j by the reciprocal, clamped (quantizeWithReciprocal) or, where every
  // group of the slab passed asymCodesInRange, not (quantizeInRange): the same codes
  auto reciprocalCodes = [&](int j, const GroupParams& p, float rcp, auto inRange) {
    uint32_t q[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      q[k] = decltype(inRange)::value ? quantizeInRange<kBits, kSym>(v[j][k], p, rcp)
                                      : quantizeWithReciprocal<kBits, kSym>(v[j][k], p, rcp);
    }
    storeCodes<kBits, kVec>(t.data, base + j * kTile + lane * kVec, q);
  };
  if (allFast) {
#pragma unroll
    for (int j = 0; j < kU; ++j) {
      GroupParams p;
      float rcp;
      fetch(j, p, rcp);
      reciprocalCodes(j, p, rcp, std::true_type{});
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kU; ++j) {
    GroupParams p;
    float rcp;
    fetch(j, p, rcp);
    const int64_t e = base + j * kTile + lane * kVec;
    const bool finite = paramsFinite(p);
    const bool constant = finite && p.scale == 0.0f;
    if (finite && !noise.on && fastScaleRange(p.scale)) {
      reciprocalCodes(j, p, rcp, std::false_type{});
      continue;
    }
    uint32_t q[kVec];
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
