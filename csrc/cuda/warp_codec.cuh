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
