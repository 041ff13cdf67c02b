// The wire format and the per-group math, written once for the CPU loops and the CUDA kernels.
//
// Everything here is a __host__ __device__ inline function over plain types: no torch, no STL.
// DESIGN invariant 3 (one codec, two devices) rests on this file: the CPU path (codec_cpu.cpp) and
// the CUDA kernels (cuda/codec_kernels.cu) call the same functions, compile them without fast-math
// and without floating-point contraction (-ffp-contract=off, nvcc -fmad=false), so for the same
// input they produce the same wire bytes and the same decoded values, bit for bit.
//
// Terms. A message is split into groups of `groupSize` consecutive elements (the last group may be
// shorter). Each group carries its own parameters:
//   symmetric  (absmax):  scale = absmax / qmax,              x^ = q * scale,
//                         q in [-qmax, qmax], qmax = 2^(bits-1) - 1  (127 or 7)
//   asymmetric (min/max): scale = hi / L - lo / L,           x^ = mid + (q - L/2) * scale,
//                         mid = lo / 2 + hi / 2, q in [0, L], L = 2^bits - 1 (255 or 15)
// The asymmetric form is centred on `mid` so that no intermediate overflows, even for groups that
// span -FLT_MAX..FLT_MAX (hi - lo would). Rounding is to nearest, ties to even. A group holding a
// NaN or an Inf gets scale = NaN, so every element of it decodes to NaN (invariant 5): a non-finite
// input never becomes a finite output. A group whose scale is 0 (all equal, all zero) decodes to
// its exact value (mid or 0).
//
// Wire layout of one encoded block of n elements (bits 4 or 8):
//   [scale[0..ng) as fp32][mid[0..ng) as fp32, asymmetric only][pad to 16][data: ceil(n*bits/8)]
// with ng = ceil(n / groupSize). 8-bit data: one byte per element (int8 two's complement when
// symmetric, uint8 when asymmetric). 4-bit data: two elements per byte, the even element in the
// low nibble. Metadata first, so a receiver can read the scales before the data (EQuARX).
// A phase set to "none" (bits = 0) ships the elements raw, in the input dtype.
#pragma once

#include <math.h>
#include <stdint.h>

#include "common/dtype.h"

namespace qcomm {

struct bf16_t {
  uint16_t bits;
};
struct fp16_t {
  uint16_t bits;
};

// ---- bit casts and conversions (exact; fp32 -> 16-bit rounds to nearest even, as torch does) ----

QCOMM_HD uint32_t floatBits(float f) {
  union {
    float f;
    uint32_t u;
  } v;
  v.f = f;
  return v.u;
}

QCOMM_HD float bitsFloat(uint32_t u) {
  union {
    uint32_t u;
    float f;
  } v;
  v.u = u;
  return v.f;
}

// Round a float of magnitude below 2^22 to the nearest integer, ties to even. Adding and removing
// 1.5 * 2^23 leaves no fraction bits; IEEE addition rounds to nearest even. Identical on CPU and
// GPU because both add in IEEE single precision (no fast-math anywhere in this project).
QCOMM_HD float roundHalfEven(float v) {
  const float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;
}

// int(roundHalfEven(v)) for |v| below 2^22: on the GPU one conversion instruction
// (cvt.rni.s32.f32 rounds to nearest, ties to even: the same integer), instead of two additions
// and a truncating conversion; elsewhere the additions.
QCOMM_HD int roundToInt(float v) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(v);
#else
  return int(roundHalfEven(v));
#endif
}

QCOMM_HD float toFloat(float x) { return x; }
QCOMM_HD float toFloat(bf16_t x) { return bitsFloat(uint32_t(x.bits) << 16); }
QCOMM_HD float toFloat(fp16_t x) {
  const uint32_t h = x.bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1fu) return bitsFloat(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    // zero or subnormal: man * 2^-24, exact in fp32
    const float v = float(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bitsFloat(sign | ((exp + 112u) << 23) | (man << 13));
}

template <class T>
QCOMM_HD T fromFloat(float f);

template <>
QCOMM_HD float fromFloat<float>(float f) {
  return f;
}

template <>
QCOMM_HD bf16_t fromFloat<bf16_t>(float f) {
  const uint32_t u = floatBits(f);
  bf16_t r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.bits = 0x7fc0u;  // NaN, as c10::BFloat16
  } else {
    r.bits = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  return r;
}

template <>
QCOMM_HD fp16_t fromFloat<fp16_t>(float f) {
  const uint32_t u = floatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  fp16_t r;
  if (a > 0x7f800000u) {
    r.bits = uint16_t(sign | 0x7e00u);  // NaN
  } else if (a >= 0x477ff000u) {
    r.bits = uint16_t(sign | 0x7c00u);  // >= 65520 rounds to Inf (65504 has an odd mantissa)
  } else if (a < 0x38800000u) {
    // below 2^-14: a half subnormal (or zero); count units of 2^-24, ties to even. The product is
    // exact (a power-of-two scaling) and below 1024, so roundHalfEven is exact too.
    const float units = roundHalfEven(bitsFloat(a) * 16777216.0f);
    r.bits = uint16_t(sign | uint32_t(units));
  } else {
    // normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even; a
    // carry out of the mantissa correctly bumps the exponent.
    r.bits = uint16_t(sign | ((a - (112u << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13));
  }
  return r;
}

// ---- codec parameters and sizes ----

// One phase's codec. bits = 0 means "none": elements travel raw in `rawDtype`.
struct CodecSpec {
  int32_t bits;       // 0, 4 or 8
  int32_t groupSize;  // power of two, 32..1024
  int32_t symmetric;  // 1: absmax scale; 0: min/max scale and midpoint
  int32_t rawDtype;   // DType of raw elements (bits == 0)
};

QCOMM_HD int64_t alignUp16(int64_t n) { return (n + 15) & ~int64_t(15); }

QCOMM_HD int64_t numGroups(int64_t n, const CodecSpec& c) {
  return (n + c.groupSize - 1) / c.groupSize;
}

// Bytes of metadata before the (16-byte aligned) data section.
QCOMM_HD int64_t metaBytes(int64_t n, const CodecSpec& c) {
  return numGroups(n, c) * 4 * (c.symmetric ? 1 : 2);
}

QCOMM_HD int64_t dataOffset(int64_t n, const CodecSpec& c) {
  return c.bits == 0 ? 0 : alignUp16(metaBytes(n, c));
}

// Exact size of one encoded block of n elements.
QCOMM_HD int64_t encodedBytes(int64_t n, const CodecSpec& c) {
  if (c.bits == 0) return n * dtypeBytes(c.rawDtype);
  return dataOffset(n, c) + (n * c.bits + 7) / 8;
}

QCOMM_HD float qmaxSym(int bits) { return bits == 8 ? 127.0f : 7.0f; }
QCOMM_HD float levelsAsym(int bits) { return bits == 8 ? 255.0f : 15.0f; }

struct GroupParams {
  float scale;
  float mid;  // asymmetric only
};

// The group's parameters from its reductions (absmax, or min and max) and its non-finite flag:
// the last step of groupParams, shared with the CUDA kernels' warp reductions.
QCOMM_HD GroupParams paramsFromAbsmax(float amax, int bad, int bits) {
  GroupParams p;
  p.scale = bad ? bitsFloat(0x7fc00000u) : (amax / qmaxSym(bits)) + 0.0f;
  p.mid = 0.0f;
  return p;
}

QCOMM_HD GroupParams paramsFromMinMax(float lo, float hi, int bad, int bits) {
  GroupParams p;
  const float levels = levelsAsym(bits);
  // "+ 0.0f" turns -0 into +0: which of -0 and +0 a min/max returns depends on the order it saw
  // them in, and the wire bytes must not.
  p.scale = bad ? bitsFloat(0x7fc00000u) : (hi / levels - lo / levels) + 0.0f;
  p.mid = bad ? 0.0f : (lo * 0.5f + hi * 0.5f) + 0.0f;
  return p;
}

// Whether |v| is not a finite float (NaN or Inf).
QCOMM_HD int nonFinite(float v) {
  const float kMax = 3.40282346638528859811704183484516925e+38f;
  const float a = bitsFloat(floatBits(v) & 0x7fffffffu);
  return !(a <= kMax);
}

// Parameters of the group x[0..n). A NaN or an Inf fails `a <= FLT_MAX` and marks the group bad.
// min, max and this flag give the same answer in any order, so the loops keep kLanes independent
// accumulators (which lets the compiler vectorize them) and a CUDA kernel may reduce in any tree;
// the only order-dependent bit, the sign of a zero min or max, is normalised below.
template <class T>
QCOMM_HD GroupParams groupParams(const T* x, int n, int bits, bool symmetric) {
  constexpr int kLanes = 8;
  const float kMax = 3.40282346638528859811704183484516925e+38f;
  int bad = 0;
  if (symmetric) {
    float amax[kLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (int j = 0; j < kLanes; ++j) {
        const float v = toFloat(x[i + j]);
        const float a = bitsFloat(floatBits(v) & 0x7fffffffu);
        bad |= !(a <= kMax);
        amax[j] = a > amax[j] ? a : amax[j];
      }
    }
    for (; i < n; ++i) {
      const float v = toFloat(x[i]);
      const float a = bitsFloat(floatBits(v) & 0x7fffffffu);
      bad |= !(a <= kMax);
      amax[0] = a > amax[0] ? a : amax[0];
    }
    float m = amax[0];
    for (int j = 1; j < kLanes; ++j) m = amax[j] > m ? amax[j] : m;
    return paramsFromAbsmax(m, bad, bits);
  } else {
    const float first = toFloat(x[0]);
    float lo[kLanes], hi[kLanes];
    for (int j = 0; j < kLanes; ++j) lo[j] = hi[j] = first;
    int i = 0;
    for (; i + kLanes <= n; i += kLanes) {
      for (int j = 0; j < kLanes; ++j) {
        const float v = toFloat(x[i + j]);
        const float a = bitsFloat(floatBits(v) & 0x7fffffffu);
        bad |= !(a <= kMax);
        lo[j] = v < lo[j] ? v : lo[j];
        hi[j] = v > hi[j] ? v : hi[j];
      }
    }
    for (; i < n; ++i) {
      const float v = toFloat(x[i]);
      const float a = bitsFloat(floatBits(v) & 0x7fffffffu);
      bad |= !(a <= kMax);
      lo[0] = v < lo[0] ? v : lo[0];
      hi[0] = v > hi[0] ? v : hi[0];
    }
    float l = lo[0], h = hi[0];
    for (int j = 1; j < kLanes; ++j) {
      l = lo[j] < l ? lo[j] : l;
      h = hi[j] > h ? hi[j] : h;
    }
    return paramsFromMinMax(l, h, bad, bits);
  }
}

QCOMM_HD bool paramsFinite(const GroupParams& p) { return p.scale == p.scale; }

// Quantize one finite value with finite, nonzero group parameters: the branch-free inner loop of
// encoding. Returns the code as stored (symmetric codes as two's complement, masked to kBits).
template <int kBits, bool kSym>
QCOMM_HD uint32_t quantizeScaled(float v, const GroupParams& p) {
  if (kSym) {
    const float qmax = qmaxSym(kBits);
    float t = v / p.scale;
    t = t < -qmax ? -qmax : (t > qmax ? qmax : t);
    return uint32_t(roundToInt(t)) & (kBits == 8 ? 0xffu : 0xfu);
  }
  const float levels = levelsAsym(kBits);
  float t = (v - p.mid) / p.scale + levels * 0.5f;
  t = t < 0.0f ? 0.0f : (t > levels ? levels : t);
  return uint32_t(roundToInt(t));
}

// quantizeScaled without a division per element, for the GPU's encoders (an IEEE division there
// is a reciprocal approximation, its refinement and a range check with a slow path). Equal to
// quantizeScaled, bit for bit, for finite v of the group whose parameters p are (symmetric:
// |v| <= the absmax p came from) and a scale inside fastScaleRange (tested by
// tests/native/simt/codec_main.cpp, and by every CUDA codec test through the kernels).
//
// Why: rcp = RN(1/s) is computed once per group. q0 = RN(x * rcp) is within 2 ulps of x/s; one
// correction q1 = RN(q0 + RN(x - q0 s) rcp) makes it faithful (error ~2^-46 relative, plus its
// rounding); a second correction with the correctly rounded reciprocal then gives exactly RN(x/s)
// (Markstein's theorem), provided the remainders x - q s are exact, which holds for
// |x| >= 2^-90 with s in range. Smaller |x| give |x/s| < 2^-30, where any value that small yields
// the same code as the exact one: round(t) is 0, and L/2 + t rounds to L/2 (its ulp is 2^-17 or
// 2^-21).
QCOMM_HD bool fastScaleRange(float s) { return s >= 0x1p-60f && s <= 0x1p60f; }

QCOMM_HD float divideByScale(float x, float s, float rcp) {
  const float q0 = x * rcp;
  const float q1 = fmaf(fmaf(-q0, s, x), rcp, q0);
  return fmaf(fmaf(-q1, s, x), rcp, q1);
}

// Symmetric: no clamp. s = RN(absmax / qmax) (paramsFromAbsmax; a normal number, in range) is at
// least (absmax / qmax)(1 - 2^-24), so |v| / s < qmax (1 + 2^-23) for |v| <= absmax: RN of it is
// at most two ulps above qmax (2^-17 each for 127, 2^-21 for 7), far below qmax + 1/2, so it
// rounds to the code of the clamped t. Asymmetric parameters carry no such bound (RN(hi / L) -
// RN(lo / L) may cancel), so that clamp stays, as min/max: t is finite here, where they equal
// quantizeScaled's comparisons.
//
// asymLine is the asymmetric t before the clamp: (v - mid) / scale + L/2, the division as above.
QCOMM_HD float asymLine(float v, const GroupParams& p, float rcp, float levels) {
  return divideByScale(v - p.mid, p.scale, rcp) + levels * 0.5f;
}

template <int kBits, bool kSym>
QCOMM_HD uint32_t quantizeWithReciprocal(float v, const GroupParams& p, float rcp) {
  if (kSym) {
    return uint32_t(roundToInt(divideByScale(v, p.scale, rcp))) & (kBits == 8 ? 0xffu : 0xfu);
  }
  const float levels = levelsAsym(kBits);
  return uint32_t(roundToInt(fminf(fmaxf(asymLine(v, p, rcp, levels), 0.0f), levels)));
}

// Whether an asymmetric group with finite minimum lo and maximum hi (its parameters p, in
// fastScaleRange, and rcp) needs no clamp: t(lo) >= -1/2 and t(hi) < L + 1/2, t = asymLine. Then
// quantizeInRange gives every value of the group the code quantizeWithReciprocal gives it, so the
// GPU's encoders skip two operations per element. Why: rounding to nearest never decreases as its
// argument grows, so t = RN(RN(RN(v - mid) / s) + L/2) is non-decreasing in v, and for
// lo <= v <= hi, t(lo) <= t(v) <= t(hi) (divideByScale is RN of the quotient for |v - mid| >=
// 2^-90; below that t is L/2, as above, inside anyway). A t in [-1/2, L + 1/2) rounds to an
// integer code in [0, L] (-1/2 to 0, ties to even), which is the code of t clamped to [0, L] first
// (rounding is monotone and 0 and L are integers). False for NaN. Almost every group passes; ones
// a few ulps wide, whose scale RN(hi / L) - RN(lo / L) is mostly rounding, can fail (t(lo) = -26
// was seen), and keep the clamp.
template <int kBits>
QCOMM_HD bool asymCodesInRange(float lo, float hi, const GroupParams& p, float rcp) {
  const float levels = levelsAsym(kBits);
  return asymLine(lo, p, rcp, levels) >= -0.5f && asymLine(hi, p, rcp, levels) < levels + 0.5f;
}

// quantizeWithReciprocal for a value of a group that passes asymCodesInRange (symmetric groups
// need no test): the same code, without the asymmetric clamp.
template <int kBits, bool kSym>
QCOMM_HD uint32_t quantizeInRange(float v, const GroupParams& p, float rcp) {
  if (kSym) return quantizeWithReciprocal<kBits, kSym>(v, p, rcp);
  return uint32_t(roundToInt(asymLine(v, p, rcp, levelsAsym(kBits))));
}

// ---- stochastic rounding (QuantConfig.stochastic_rounding) ----
//
// Instead of rounding t to the nearest code, round down after adding u ~ U[0, 1): E[code] = t, so
// the quantization error has mean zero (what gradient traffic wants). u comes from a counter-based
// hash of (salt, element index), so the CPU loops and a CUDA kernel draw the same u for the same
// element, in any order. The salt names the call, the encoding rank and the phase.
struct Noise {
  uint32_t salt;
  int64_t base;  // absolute index of the block's first element in the message
  int32_t on;
};

// A 32-bit integer mixer (the "lowbias32" finaliser of Chris Wellons' hash prospector).
QCOMM_HD uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

QCOMM_HD uint32_t noiseSalt(uint32_t callSeq, int rank, int phase) {
  return hash32(hash32(callSeq) ^ (uint32_t(rank) * 2u + uint32_t(phase) + 0x9e3779b9u));
}

// u in [0, 1) with 24 random bits (exact in fp32) for element `idx` of the block.
QCOMM_HD float noiseAt(const Noise& nz, int64_t idx) {
  const uint64_t i = uint64_t(nz.base + idx);
  const uint32_t h = hash32(hash32(uint32_t(i)) ^ uint32_t(i >> 32) ^ nz.salt);
  return float(h >> 8) * 5.9604644775390625e-8f;
}

// quantizeScaled with stochastic rounding: floor(t + u), kept in range (t + u can round up to
// the code past the last one when t sits at the top of the range).
template <int kBits, bool kSym>
QCOMM_HD uint32_t quantizeStochastic(float v, const GroupParams& p, float u) {
  const float lo = kSym ? -qmaxSym(kBits) : 0.0f;
  const float hi = kSym ? qmaxSym(kBits) : levelsAsym(kBits);
  float t = kSym ? v / p.scale : (v - p.mid) / p.scale + levelsAsym(kBits) * 0.5f;
  t = t < lo ? lo : (t > hi ? hi : t);
  float q = floorf(t + u);
  q = q > hi ? hi : q;
  return uint32_t(int(q)) & (kBits == 8 ? 0xffu : 0xfu);
}

// The code of every element of a group whose scale is 0 (all elements equal): 0, or L/2 rounded
// to even (128 or 8), both of which decode to exactly mid.
template <int kBits, bool kSym>
QCOMM_HD uint32_t zeroScaleCode() {
  return kSym ? 0u : uint32_t(roundHalfEven(levelsAsym(kBits) * 0.5f));
}

// Quantize one finite value with finite group parameters.
template <int kBits, bool kSym>
QCOMM_HD uint32_t quantizeOne(float v, const GroupParams& p) {
  return p.scale != 0.0f ? quantizeScaled<kBits, kSym>(v, p) : zeroScaleCode<kBits, kSym>();
}

// Keep a decoded value of a finite group finite: the rounded scale can put qmax * scale a hair
// above FLT_MAX for groups that reach it. NaN compares false and passes through unchanged.
QCOMM_HD float clampToFinite(float v) {
  const float kMax = 3.40282346638528859811704183484516925e+38f;
  return v > kMax ? kMax : (v < -kMax ? -kMax : v);
}

// Decode one stored code, before clampToFinite: q * scale (symmetric; q from -2^(bits-1) to
// 2^(bits-1) - 1), or mid + (code - L/2) * scale.
template <int kBits, bool kSym>
QCOMM_HD float dequantizeUnclamped(uint32_t code, const GroupParams& p) {
  if (kSym) {
    const int q = kBits == 8 ? int(int8_t(uint8_t(code))) : int((code ^ 8u) & 0xfu) - 8;
    return float(q) * p.scale;
  }
  const float centred = float(int(code)) - levelsAsym(kBits) * 0.5f;
  const float scaled = centred * p.scale;
  return p.mid + scaled;
}

// Decode one stored code.
template <int kBits, bool kSym>
QCOMM_HD float dequantizeOne(uint32_t code, const GroupParams& p) {
  return clampToFinite(dequantizeUnclamped<kBits, kSym>(code, p));
}

// Whether no code of a group with parameters p decodes to a magnitude that clampToFinite changes:
// |scale| <= 2^119 (and |mid| <= 2^126, asymmetric) keeps every |q * scale| and |mid + c * scale|
// (|q| <= 128, |c| <= 127.5) below 2^127 < FLT_MAX. False for a NaN or Inf parameter.
template <bool kSym>
QCOMM_HD bool decodesFinite(const GroupParams& p) {
  return fabsf(p.scale) <= 0x1p119f && (kSym || fabsf(p.mid) <= 0x1p126f);
}

QCOMM_HD GroupParams loadParams(const uint8_t* block, int64_t n, const CodecSpec& c, int64_t g) {
  const float* meta = reinterpret_cast<const float*>(block);
  GroupParams p;
  p.scale = meta[g];
  p.mid = c.symmetric ? 0.0f : meta[numGroups(n, c) + g];
  return p;
}

QCOMM_HD void storeParams(uint8_t* block, int64_t n, const CodecSpec& c, int64_t g,
                          const GroupParams& p) {
  float* meta = reinterpret_cast<float*>(block);
  meta[g] = p.scale;
  if (!c.symmetric) meta[numGroups(n, c) + g] = p.mid;
}

QCOMM_HD int groupLength(int64_t n, const CodecSpec& c, int64_t g) {
  const int64_t rest = n - g * c.groupSize;
  return int(rest < c.groupSize ? rest : c.groupSize);
}

// Encode group g of the block x[0..n) into `block` (an encoded block of n elements). The three
// cases (non-finite, constant, general) are decided once per group so that the general loop is
// branch-free and vectorizes.
//
// encodeGroupValues takes the group's `len` values at `in` (the message's, or a rotated copy);
// encodeGroupT the message x[0..n) itself.
template <int kBits, bool kSym, class T>
QCOMM_HD void encodeGroupValues(const T* in, int len, int64_t n, const CodecSpec& c, int64_t g,
                                uint8_t* block, const Noise& noise) {
  const int64_t begin = g * c.groupSize;
  const GroupParams p = groupParams(in, len, kBits, kSym);
  storeParams(block, n, c, g, p);
  uint8_t* data = block + dataOffset(n, c);
  if (kBits == 8) {
    uint8_t* out = data + begin;
    if (!paramsFinite(p) || p.scale == 0.0f) {
      const uint8_t code = paramsFinite(p) ? uint8_t(zeroScaleCode<8, kSym>()) : 0;
      for (int i = 0; i < len; ++i) out[i] = code;
      return;
    }
    if (noise.on) {
      for (int i = 0; i < len; ++i) {
        const float u = noiseAt(noise, begin + i);
        out[i] = uint8_t(quantizeStochastic<8, kSym>(toFloat(in[i]), p, u));
      }
      return;
    }
    for (int i = 0; i < len; ++i) out[i] = uint8_t(quantizeScaled<8, kSym>(toFloat(in[i]), p));
    return;
  }
  // groupSize is even, so a group starts on a byte boundary; an odd tail leaves the high nibble 0
  uint8_t* out = data + begin / 2;
  const int pairs = len / 2;
  if (!paramsFinite(p) || p.scale == 0.0f) {
    const uint32_t code = paramsFinite(p) ? zeroScaleCode<4, kSym>() : 0u;
    for (int i = 0; i < pairs; ++i) out[i] = uint8_t(code | (code << 4));
    if (len & 1) out[pairs] = uint8_t(code);
    return;
  }
  if (noise.on) {
    for (int i = 0; i < len; ++i) {
      const uint32_t q = quantizeStochastic<4, kSym>(toFloat(in[i]), p, noiseAt(noise, begin + i));
      out[i / 2] = (i & 1) ? uint8_t(out[i / 2] | (q << 4)) : uint8_t(q);
    }
    return;
  }
  for (int i = 0; i < pairs; ++i) {
    const uint32_t lo = quantizeScaled<4, kSym>(toFloat(in[2 * i]), p);
    const uint32_t hi = quantizeScaled<4, kSym>(toFloat(in[2 * i + 1]), p);
    out[i] = uint8_t(lo | (hi << 4));
  }
  if (len & 1) out[pairs] = uint8_t(quantizeScaled<4, kSym>(toFloat(in[len - 1]), p));
}

template <int kBits, bool kSym, class T>
QCOMM_HD void encodeGroupT(const T* x, int64_t n, const CodecSpec& c, int64_t g, uint8_t* block,
                           const Noise& noise) {
  const int64_t begin = g * c.groupSize;
  encodeGroupValues<kBits, kSym>(x + begin, groupLength(n, c, g), n, c, g, block, noise);
}

// Decode group g of an encoded block of n elements; out[i] for i in the group receives x^ (or,
// with kAccumulate, out[i] += x^). decodeGroupValues writes the group's values to o[0..len).
template <int kBits, bool kSym, bool kAccumulate>
QCOMM_HD void decodeGroupValues(const uint8_t* block, int64_t n, const CodecSpec& c, int64_t g,
                                float* o) {
  const int64_t begin = g * c.groupSize;
  const int len = groupLength(n, c, g);
  const GroupParams p = loadParams(block, n, c, g);
  const uint8_t* data = block + dataOffset(n, c);
  if (kBits == 8) {
    const uint8_t* in = data + begin;
    for (int i = 0; i < len; ++i) {
      const float v = dequantizeOne<8, kSym>(in[i], p);
      o[i] = kAccumulate ? o[i] + v : v;
    }
    return;
  }
  const uint8_t* in = data + begin / 2;
  const int pairs = len / 2;
  for (int i = 0; i < pairs; ++i) {
    const float lo = dequantizeOne<4, kSym>(in[i] & 0xfu, p);
    const float hi = dequantizeOne<4, kSym>(uint32_t(in[i]) >> 4, p);
    o[2 * i] = kAccumulate ? o[2 * i] + lo : lo;
    o[2 * i + 1] = kAccumulate ? o[2 * i + 1] + hi : hi;
  }
  if (len & 1) {
    const float v = dequantizeOne<4, kSym>(in[pairs] & 0xfu, p);
    o[len - 1] = kAccumulate ? o[len - 1] + v : v;
  }
}

template <int kBits, bool kSym, bool kAccumulate>
QCOMM_HD void decodeGroupT(const uint8_t* block, int64_t n, const CodecSpec& c, int64_t g,
                           float* out) {
  decodeGroupValues<kBits, kSym, kAccumulate>(block, n, c, g, out + g * c.groupSize);
}

// ---- Hadamard rotation of a group (QuantConfig.rotate) ----
//
// y = H x with H the unnormalised g x g Walsh-Hadamard matrix (entries +-1), computed by the fast
// transform: stages h = 1, 2, 4, ..., g/2 in that order, each replacing every pair (x[j], x[j + h])
// (j with bit h clear) by (a + b, a - b). Every output of a stage depends only on the pair it came
// from, so the order in which a stage visits its pairs (a CUDA warp's lanes, a vector's) does not
// change a bit; the order of the stages does, and is fixed (qcomm/reference.py). H H = g I, so
// x = H y / g; g is a power of two, so the division is exact. Rotation spreads an outlier's
// energy over its whole group, which shrinks the quantization step of the other elements; it is
// linear, so ranks sum in the rotated domain and one inverse rotation at the end suffices.
//
// The rotated codec works on whole groups only (the plan pads a message to whole groups), so
// that encoding rotates each group in a local buffer on its way into the quantizer and decoding
// rotates it back on its way out: no pass over the message of its own.
constexpr int kMaxGroupSize = 1024;

// One stage h = H of the transform on a group of G elements, then the later ones. G and H are
// compile-time constants, so each stage's loops have fixed trip counts: the compiler unrolls and
// vectorizes them (about 15x the speed of the same loops with a run-time group size, measured on
// the dev VM).
template <int G, int H = 1>
QCOMM_HD void hadamardStages(float* x) {
  if constexpr (H < G) {
    for (int i = 0; i < G; i += 2 * H) {
      for (int j = i; j < i + H; ++j) {
        const float a = x[j];
        const float b = x[j + H];
        x[j] = a + b;
        x[j + H] = a - b;
      }
    }
    hadamardStages<G, 2 * H>(x);
  }
}

QCOMM_HD void hadamardGroup(float* x, int g) {
  switch (g) {
    case 32:
      return hadamardStages<32>(x);
    case 64:
      return hadamardStages<64>(x);
    case 128:
      return hadamardStages<128>(x);
    case 256:
      return hadamardStages<256>(x);
    case 512:
      return hadamardStages<512>(x);
    case 1024:
      return hadamardStages<1024>(x);
    default:
      break;
  }
  for (int h = 1; h < g; h *= 2) {
    for (int i = 0; i < g; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = x[j];
        const float b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

// buf[0..g) = H float(in[0..g)).
template <class T>
QCOMM_HD void rotateGroupInto(const T* in, int g, float* buf) {
  for (int i = 0; i < g; ++i) buf[i] = toFloat(in[i]);
  hadamardGroup(buf, g);
}

// out[0..g) = H buf / g (buf is overwritten).
QCOMM_HD void unrotateGroupInto(float* buf, int g, float* out) {
  const float inv = 1.0f / float(g);  // a power of two: exact
  hadamardGroup(buf, g);
  for (int i = 0; i < g; ++i) out[i] = buf[i] * inv;
}

// Run-time dispatch to the four (bits, symmetric) instantiations.
template <class T>
QCOMM_HD void encodeGroup(const T* x, int64_t n, const CodecSpec& c, int64_t g, uint8_t* block,
                          const Noise& noise) {
  if (c.bits == 8) {
    if (c.symmetric)
      encodeGroupT<8, true>(x, n, c, g, block, noise);
    else
      encodeGroupT<8, false>(x, n, c, g, block, noise);
  } else {
    if (c.symmetric)
      encodeGroupT<4, true>(x, n, c, g, block, noise);
    else
      encodeGroupT<4, false>(x, n, c, g, block, noise);
  }
}

template <bool kAccumulate>
QCOMM_HD void decodeGroup(const uint8_t* block, int64_t n, const CodecSpec& c, int64_t g,
                          float* out) {
  if (c.bits == 8) {
    if (c.symmetric)
      decodeGroupT<8, true, kAccumulate>(block, n, c, g, out);
    else
      decodeGroupT<8, false, kAccumulate>(block, n, c, g, out);
  } else {
    if (c.symmetric)
      decodeGroupT<4, true, kAccumulate>(block, n, c, g, out);
    else
      decodeGroupT<4, false, kAccumulate>(block, n, c, g, out);
  }
}

// Encode group g of x[0..n) rotated: the codes of H x[group], as encodeGroup of the rotated
// message gives them. n is a multiple of the group size.
template <class T>
QCOMM_HD void encodeRotatedGroup(const T* x, int64_t n, const CodecSpec& c, int64_t g,
                                 uint8_t* block, const Noise& noise) {
  float buf[kMaxGroupSize];
  rotateGroupInto(x + g * c.groupSize, c.groupSize, buf);
  const int len = c.groupSize;
  if (c.bits == 8) {
    if (c.symmetric)
      encodeGroupValues<8, true>(buf, len, n, c, g, block, noise);
    else
      encodeGroupValues<8, false>(buf, len, n, c, g, block, noise);
  } else {
    if (c.symmetric)
      encodeGroupValues<4, true>(buf, len, n, c, g, block, noise);
    else
      encodeGroupValues<4, false>(buf, len, n, c, g, block, noise);
  }
}

// Decode group g of an encoded block of n elements (a multiple of the group size) and rotate it
// back: out[group] = H x^ / g.
QCOMM_HD void decodeRotatedGroup(const uint8_t* block, int64_t n, const CodecSpec& c, int64_t g,
                                 float* out) {
  float buf[kMaxGroupSize];
  if (c.bits == 8) {
    if (c.symmetric)
      decodeGroupValues<8, true, false>(block, n, c, g, buf);
    else
      decodeGroupValues<8, false, false>(block, n, c, g, buf);
  } else {
    if (c.symmetric)
      decodeGroupValues<4, true, false>(block, n, c, g, buf);
    else
      decodeGroupValues<4, false, false>(block, n, c, g, buf);
  }
  unrotateGroupInto(buf, c.groupSize, out + g * c.groupSize);
}

}  // namespace qcomm
