// Warp-level building blocks of the CUDA codec, over csrc/codec/codec.h: one warp computes a
// group's parameters and quantizes it. Shared by the codec kernels and the fused CUDA-IPC two_step.
#pragma once

#include <cuda_runtime.h>

#include "codec/codec.h"

namespace qcomm {
namespace gpu {

constexpr int kWarp = 32;

__device__ __forceinline__ float warpMax(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

__device__ __forceinline__ float warpMin(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w < v ? w : v;
  }
  return v;
}

__device__ __forceinline__ int warpOr(int v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v |= __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The parameters of a group whose values lane i reads at positions i, i + 32, ... through
// `value(k)`; every lane gets them.
template <bool kSym, class F>
__device__ GroupParams warpGroupParams(int len, int bits, F value) {
  const int lane = threadIdx.x % kWarp;
  int bad = 0;
  if (kSym) {
    float amax = 0.0f;
    for (int k = lane; k < len; k += kWarp) {
      const float v = value(k);
      bad |= nonFinite(v);
      const float a = bitsFloat(floatBits(v) & 0x7fffffffu);
      amax = a > amax ? a : amax;
    }
    return paramsFromAbsmax(warpMax(amax), warpOr(bad), bits);
  }
  const float first = value(0);
  float lo = first, hi = first;
  for (int k = lane; k < len; k += kWarp) {
    const float v = value(k);
    bad |= nonFinite(v);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  return paramsFromMinMax(warpMin(lo), warpMax(hi), warpOr(bad), bits);
}

// Quantize the group's values (through `value`) into its codes, as codec.h encodeGroupT does.
template <int kBits, bool kSym, class F>
__device__ void warpQuantize(const GroupParams& p, int64_t begin, int len, uint8_t* data,
                             const Noise& noise, F value) {
  const int lane = threadIdx.x % kWarp;
  const bool finite = paramsFinite(p);
  const bool constant = finite && p.scale == 0.0f;
  // the common case divides by the reciprocal (quantizeWithReciprocal: the same codes)
  const bool fast = finite && !noise.on && fastScaleRange(p.scale);
  const float rcp = fast ? 1.0f / p.scale : 0.0f;
  auto code = [&](int k) -> uint32_t {
    if (fast) return quantizeWithReciprocal<kBits, kSym>(value(k), p, rcp);
    if (!finite) return 0u;
    if (constant) return zeroScaleCode<kBits, kSym>();
    const float v = value(k);
    return noise.on ? quantizeStochastic<kBits, kSym>(v, p, noiseAt(noise, begin + k))
                    : quantizeScaled<kBits, kSym>(v, p);
  };
  if (kBits == 8) {
    for (int k = lane; k < len; k += kWarp) data[begin + k] = uint8_t(code(k));
  } else {
    const int bytes = (len + 1) / 2;
    for (int b = lane; b < bytes; b += kWarp) {
      const uint32_t lo = code(2 * b);
      const uint32_t hi = 2 * b + 1 < len ? code(2 * b + 1) : 0u;
      data[begin / 2 + b] = uint8_t(lo | (hi << 4));
    }
  }
}

// The code of element e of a data section (4-bit: even elements in the low nibble).
template <int kBits>
__device__ __forceinline__ uint32_t codeAt(const uint8_t* data, int64_t e) {
  return kBits == 8 ? data[e] : (uint32_t(data[e >> 1]) >> ((e & 1) * 4)) & 0xfu;
}

template <int kBits, bool kSym>
__device__ __forceinline__ float decodeAt(const uint8_t* block, int64_t n, const CodecSpec& c,
                                          int64_t e) {
  const GroupParams p = loadParams(block, n, c, e / c.groupSize);
  return dequantizeOne<kBits, kSym>(codeAt<kBits>(block + dataOffset(n, c), e), p);
}

// One warp encodes group g of the n-element block whose values come from value(k), k in the
// group: warp reductions, then each lane quantizes elements lane, lane + 32, ...
template <int kBits, bool kSym, class F>
__device__ __forceinline__ void encodeGroupWarp(uint8_t* block, int64_t n, const CodecSpec& c,
                                                int64_t g, const Noise& noise, F value) {
  const int len = groupLength(n, c, g);
  const GroupParams p = warpGroupParams<kSym>(len, kBits, value);
  if (threadIdx.x % kWarp == 0) storeParams(block, n, c, g, p);
  warpQuantize<kBits, kSym>(p, g * c.groupSize, len, block + dataOffset(n, c), noise, value);
}

// ---- the rotated codec (codec.h hadamardGroup): one warp per group, the group in registers ----
//
// Lane l holds elements l, l + 32, ..., l + 32 (per - 1) of its group in v[0..per), per =
// groupSize / 32 (1 to kMaxPerLane): loads and stores are coalesced, stages h = 1..16 pair lanes
// l and l ^ h (a shuffle), and stages 32.. pair registers j and j + h / 32 of one lane. The
// stages run in codec.h's order and every pair computes (a + b, a - b) with a the lower element,
// so the bits are the CPU's whatever order the pairs of one stage take.
constexpr int kMaxPerLane = kMaxGroupSize / kWarp;

// v = H v over the warp's group. per is a run-time value, the same in every lane (so the
// shuffles are reached by all 32); the loops are unrolled over kMaxPerLane so that every index
// into v is a constant (a dynamic one would move v to local memory).
__device__ __forceinline__ void warpHadamard(float (&v)[kMaxPerLane], int per) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int h = 1; h < kWarp; h *= 2) {
    const bool upper = (lane & h) != 0;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      if (j < per) {
        const float other = __shfl_xor_sync(0xffffffffu, v[j], h);
        v[j] = upper ? other - v[j] : v[j] + other;
      }
    }
  }
#pragma unroll
  for (int s = 1; s < kMaxPerLane; s *= 2) {
    if (s < per) {
#pragma unroll
      for (int j = 0; j < kMaxPerLane; ++j) {
        if ((j & s) == 0 && j + s < per) {
          const float a = v[j];
          const float b = v[j + s];
          v[j] = a + b;
          v[j + s] = a - b;
        }
      }
    }
  }
}

// The parameters of a group held as above; every lane gets them. min, max and the non-finite
// flag do not depend on the order of the reduction (codec.h groupParams).
template <bool kSym>
__device__ GroupParams warpRegisterParams(const float (&v)[kMaxPerLane], int per, int bits) {
  int bad = 0;
  if (kSym) {
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      if (j < per) {
        bad |= nonFinite(v[j]);
        const float a = bitsFloat(floatBits(v[j]) & 0x7fffffffu);
        amax = a > amax ? a : amax;
      }
    }
    return paramsFromAbsmax(warpMax(amax), warpOr(bad), bits);
  }
  float lo = v[0], hi = v[0];
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    if (j < per) {
      bad |= nonFinite(v[j]);
      lo = v[j] < lo ? v[j] : lo;
      hi = v[j] > hi ? v[j] : hi;
    }
  }
  return paramsFromMinMax(warpMin(lo), warpMax(hi), warpOr(bad), bits);
}

// Encode group g (beginning at element `begin` of the n-element block) from its values held as
// above, as codec.h encodeGroupValues does: the same parameters and codes (the division-free
// quantizer where it gives the same codes, as warpQuantize).
template <int kBits, bool kSym>
__device__ void encodeRegistersWarp(const float (&v)[kMaxPerLane], int per, uint8_t* block,
                                    int64_t n, const CodecSpec& c, int64_t g, const Noise& noise) {
  const int lane = threadIdx.x % kWarp;
  const int64_t begin = g * c.groupSize;
  const GroupParams p = warpRegisterParams<kSym>(v, per, kBits);
  if (lane == 0) storeParams(block, n, c, g, p);
  uint8_t* data = block + dataOffset(n, c);
  const bool finite = paramsFinite(p);
  const bool constant = finite && p.scale == 0.0f;
  const bool fast = finite && !noise.on && fastScaleRange(p.scale);
  const float rcp = fast ? 1.0f / p.scale : 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    if (j < per) {
      const int64_t k = int64_t(j) * kWarp + lane;
      uint32_t q;
      if (fast) {
        q = quantizeWithReciprocal<kBits, kSym>(v[j], p, rcp);
      } else if (!finite) {
        q = 0u;
      } else if (constant) {
        q = zeroScaleCode<kBits, kSym>();
      } else if (noise.on) {
        q = quantizeStochastic<kBits, kSym>(v[j], p, noiseAt(noise, begin + k));
      } else {
        q = quantizeScaled<kBits, kSym>(v[j], p);
      }
      if (kBits == 8) {
        data[begin + k] = uint8_t(q);
      } else {
        // elements 2i and 2i + 1 sit in lanes 2i and 2i + 1 of one register: the even lane
        // stores the byte (groupSize >= 32, so a group starts on a byte boundary)
        const uint32_t high = __shfl_xor_sync(0xffffffffu, q, 1);
        if ((lane & 1) == 0) data[(begin + k) / 2] = uint8_t(q | (high << 4));
      }
    }
  }
}

// A quantized codec's compile-time variant.
template <int kBits, bool kSym>
struct Codec {
  static constexpr int bits = kBits;
  static constexpr bool sym = kSym;
};

// f(Codec<bits, symmetric>{}) for a quantized spec (bits 4 or 8): the one place where a codec
// chosen at run time picks its kernel variant, on the host (launches) and on the device.
#pragma nv_exec_check_disable
template <class F>
__host__ __device__ __forceinline__ void withCodec(const CodecSpec& c, F&& f) {
  if (c.bits == 8) {
    if (c.symmetric)
      f(Codec<8, true>{});
    else
      f(Codec<8, false>{});
  } else {
    if (c.symmetric)
      f(Codec<4, true>{});
    else
      f(Codec<4, false>{});
  }
}

}  // namespace gpu
}  // namespace qcomm
