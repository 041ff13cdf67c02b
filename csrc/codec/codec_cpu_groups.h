// The CPU's encoder for whole groups of a size fixed at compile time, over codec.h's arithmetic.
//
// codec.h's encodeGroupValues is the definition of the wire bytes, written for any group length
// and shared with the CUDA kernels. Compiled for the CPU it leaves most cycles on the table: the
// group length is known only at run time, every element pays an IEEE division, a bf16/fp16 input
// is widened once for the min/max pass and again for the quantizer, and 4-bit codes are packed
// pair by pair. This file encodes the same bytes a faster way, for the full groups of the common
// sizes (32..1024), deterministic rounding:
//   * groups are taken a few at a time (blockGroups): the parameters of each, then the codes of
//     each, so the parameters' dependent chains of instructions overlap across groups;
//   * the group is widened to fp32 once, into a buffer that stays in L1 for both passes (fp32
//     input is read in place), so the min/max pass and the quantizer each read it once;
//   * groupParams and the quantizer loops see the group size G as a constant: fixed trip counts,
//     no tails, which the compiler unrolls and vectorizes at the width of the instruction set the
//     caller is compiled for (codec_cpu.cpp);
//   * the division by the scale stays an IEEE division: codec.h's divideByScale (a reciprocal
//     per group and two FMA corrections, bit-identical for scales in fastScaleRange) measured
//     slower here with AVX2 and AVX-512 (8.9 against 10.2 GB/s and 9.7 against 11.3, fp32 8-bit
//     asymmetric g128, one core of the dev VM's Xeon; the vector division is cheap on it), and
//     with AVX2 on a Zen 1 core as well (benchmarks/RESULTS.md section 2);
//   * the clamp and the rounding are quantizeScaled's (ternary clamps, roundHalfEven), with no
//     branch per element: non-finite and constant groups are decided once per group, as in
//     encodeGroupValues;
//   * 4-bit codes are written to a byte buffer first and packed two by two in a separate loop
//     over whole bytes, which vectorizes (the pairwise form of encodeGroupValues does not).
// Stochastic rounding, the last (short) group and any other group size go through
// encodeGroupValues unchanged. tests/codec/test_cpu_groups.py compares both paths, every
// instruction set, with the reference model.
#pragma once

#include <stdint.h>

#include "codec/codec.h"

namespace qcomm {
namespace cpu {

// The stored code of v (quantizeScaled's), as an int32 whose low kBits bits are the code:
// t = (v - mid) / scale + L/2 or v / scale, as quantizeScaled computes it, then x = t + 1.5 * 2^23
// (roundHalfEven's first addition), then x's bits clamped as an int32 to those of
// 1.5 * 2^23 + [0, L] or + [-qmax, qmax]. Why that is quantizeScaled's code: t is never NaN here
// (finite v, finite nonzero parameters), and rounding to nearest never decreases as its argument
// grows, so x is non-decreasing in t; the bits of a non-negative float order like the float and
// those of a negative one (t below -1.5 * 2^23) lie below every positive float's; between
// 1.5 * 2^23 - 127 and 1.5 * 2^23 + 255 a float's ulp is 1, so x there is an integer and its
// bits are 0x4b400000 + (x - 1.5 * 2^23), whose low byte is the two's complement code (the low
// byte of 0x4b400000 is 0). Hence the clamped bits give the code of roundHalfEven(t) clamped to
// the same range, which is quantizeScaled's (a clamp to integer bounds commutes with a
// non-decreasing rounding that keeps integers). It replaces the float clamps, the second
// addition and the float-to-int conversion by two integer min/max, which vectorize (GCC leaves
// quantizeScaled's clamp-then-round a scalar loop here: with trapping math it does not if-convert
// the nested clamp, and it sinks the addition after a clamp into its branches).
template <int kBits, bool kSym>
QCOMM_ALWAYS_INLINE int32_t codeBits(float v, const GroupParams& p) {
  const float kMagic = 12582912.0f;  // 1.5 * 2^23, codec.h roundHalfEven's
  const int32_t kMagicBits = 0x4b400000;
  const float t = kSym ? v / p.scale : (v - p.mid) / p.scale + levelsAsym(kBits) * 0.5f;
  const int32_t lo = kSym ? kMagicBits - int32_t(qmaxSym(kBits)) : kMagicBits;
  const int32_t hi = kMagicBits + int32_t(kSym ? qmaxSym(kBits) : levelsAsym(kBits));
  int32_t b = int32_t(floatBits(t + kMagic));
  b = b < lo ? lo : b;
  return b > hi ? hi : b;
}

// The bits of a float as an int32 whose order is the float's (-0 below +0; NaNs outside the
// infinities): flip the magnitude bits of negative values. Its own inverse.
QCOMM_ALWAYS_INLINE int32_t orderedBits(uint32_t u) {
  return int32_t(u ^ (uint32_t(int32_t(u) >> 31) & 0x7fffffffu));
}

// groupParams(v, G, kBits, kSym) of G values, in a form that vectorizes. codec.h's loop compares
// floats (x < lo, and |x| <= FLT_MAX for the non-finite flag), which GCC leaves scalar with
// trapping math on (as this project builds): it was most of the encoder's time. Here every
// reduction is an integer min or max, which vectorizes at any width:
//   symmetric: the magnitude bits (as unsigned) order like the magnitudes, and are at least those
//     of +Inf exactly for a NaN or an Inf, so one max gives both the absmax and the flag;
//   asymmetric: orderedBits orders like the values; a NaN or Inf lies above FLT_MAX's key or
//     below -FLT_MAX's, so the min and max give the flag too.
// Min and max are the same values in any order; where the float loop may return -0 or +0 for a
// zero min or max, paramsFromMinMax normalises the sign, as codec.h groupParams relies on. A
// non-finite group's min and max are not used.
template <int kBits, bool kSym, int G>
QCOMM_ALWAYS_INLINE GroupParams groupParamsFixed(const float* v) {
  if (kSym) {
    uint32_t mag = 0;
    for (int i = 0; i < G; ++i) {
      const uint32_t m = floatBits(v[i]) & 0x7fffffffu;
      mag = m > mag ? m : mag;
    }
    return paramsFromAbsmax(bitsFloat(mag), mag >= 0x7f800000u, kBits);
  }
  int32_t lo = orderedBits(floatBits(v[0])), hi = lo;
  for (int i = 0; i < G; ++i) {
    const int32_t k = orderedBits(floatBits(v[i]));
    lo = k < lo ? k : lo;
    hi = k > hi ? k : hi;
  }
  const int bad = hi > orderedBits(0x7f7fffffu) || lo < orderedBits(0xff7fffffu);
  return paramsFromMinMax(bitsFloat(uint32_t(orderedBits(uint32_t(lo)))),
                          bitsFloat(uint32_t(orderedBits(uint32_t(hi)))), bad, kBits);
}

// codes[i] = the stored code of v[i] (quantizeScaled's), for a group of G finite values with
// finite, nonzero parameters. Symmetric codes are two's complement, masked to kBits by the
// narrowing (8 bits) or by the packing (4 bits).
template <int kBits, bool kSym, int G>
QCOMM_ALWAYS_INLINE void codesOf(const float* v, const GroupParams& p, uint8_t* codes) {
  for (int i = 0; i < G; ++i) codes[i] = uint8_t(codeBits<kBits, kSym>(v[i], p));
}

// The group's G values as fp32: fp32 input in place, 16-bit input widened into buf (codec.h
// toFloat; exact, so any instruction that widens exactly gives the same values).
template <int G>
QCOMM_ALWAYS_INLINE const float* groupFloats(const float* in, float*) {
  return in;
}
template <int G, class T>
QCOMM_ALWAYS_INLINE const float* groupFloats(const T* in, float* buf) {
  for (int i = 0; i < G; ++i) buf[i] = toFloat(in[i]);
  return buf;
}

// Where encodeFullGroups writes: the block's scale and midpoint arrays and its data section,
// computed once per range of groups (each takes a division by the group size).
struct BlockLayout {
  float* scales;
  float* mids;  // asymmetric only
  uint8_t* data;
};

QCOMM_ALWAYS_INLINE BlockLayout blockLayout(uint8_t* block, int64_t n, const CodecSpec& c) {
  float* scales = reinterpret_cast<float*>(block);
  return BlockLayout{scales, scales + numGroups(n, c), block + dataOffset(n, c)};
}

// The number of full groups encodeGroupsFixed takes at once: their parameters are computed
// first, then their codes. One group's codes wait on its min/max reduction and the scalar
// arithmetic of its parameters (two divisions), a chain of dependent instructions that one group's
// quantizer loop is too long for the CPU's out-of-order window to overlap with; the parameters of
// independent groups overlap each other. Up to 1024 values (4 KiB as fp32, in L1), at most 8
// groups; groups of 32 one at a time, as before (blocks of 8 measured 3% slower there, 1.08x
// faster for groups of 128: the AVX2 loops on one Zen 1 core, benchmarks/RESULTS.md section 2).
constexpr int blockGroups(int G) {
  return G <= 32 || G >= 1024 ? 1 : (1024 / G > 8 ? 8 : 1024 / G);
}

// Encode the full groups g0..g0+k of x (k <= blockGroups(G)), deterministic rounding: the bytes of
// encodeGroupValues<kBits, kSym>(group, G, n, c, g, block, no noise) for each. kRotate: each group
// rotated first (codec.h rotateGroupInto; rotated blocks hold whole groups), the bytes of
// encodeRotatedGroup.
template <int kBits, bool kSym, bool kRotate, int G, class T>
QCOMM_ALWAYS_INLINE void encodeFullGroups(const T* x, int64_t g0, int k, const BlockLayout& at) {
  constexpr int K = blockGroups(G);
  constexpr bool kInPlace = !kRotate && sizeof(T) == sizeof(float);
  float buf[kInPlace ? 1 : K * G];
  const float* v[K];
  GroupParams p[K];
  for (int j = 0; j < k; ++j) {
    const T* in = x + (g0 + j) * G;
    if (kRotate) {
      rotateGroupInto(in, G, buf + j * G);
      v[j] = buf + j * G;
    } else {
      v[j] = groupFloats<G>(in, buf + (kInPlace ? 0 : j * G));
    }
    p[j] = groupParamsFixed<kBits, kSym, G>(v[j]);
  }
  for (int j = 0; j < k; ++j) {
    const int64_t g = g0 + j;
    at.scales[g] = p[j].scale;
    if (!kSym) at.mids[g] = p[j].mid;
    uint8_t* out = at.data + g * (G * kBits / 8);
    if (!paramsFinite(p[j]) || p[j].scale == 0.0f) {
      const uint32_t code = paramsFinite(p[j]) ? zeroScaleCode<kBits, kSym>() : 0u;
      const uint8_t byte = kBits == 8 ? uint8_t(code) : uint8_t(code | (code << 4));
      for (int i = 0; i < G * kBits / 8; ++i) out[i] = byte;
      continue;
    }
    if (kBits == 8) {
      codesOf<8, kSym, G>(v[j], p[j], out);
      continue;
    }
    uint8_t codes[G];
    codesOf<4, kSym, G>(v[j], p[j], codes);
    // the even element in the low nibble
    for (int i = 0; i < G / 2; ++i) {
      out[i] = uint8_t((codes[2 * i] & 0xfu) | ((codes[2 * i + 1] & 0xfu) << 4));
    }
  }
}

// Encode groups g0..g1 of x[0..n): full groups of G through encodeFullGroups, blockGroups(G) at a
// time, a short last group through encodeGroupValues. kRotate: as encodeFullGroups.
template <int kBits, bool kSym, bool kRotate, int G, class T>
QCOMM_ALWAYS_INLINE void encodeGroupsFixed(const T* x, int64_t n, const CodecSpec& c, int64_t g0,
                                           int64_t g1, uint8_t* block) {
  constexpr int K = blockGroups(G);
  const BlockLayout at = blockLayout(block, n, c);
  const int64_t full = n / G;
  const int64_t end = g1 < full ? g1 : full;
  for (int64_t g = g0; g < end; g += K) {
    encodeFullGroups<kBits, kSym, kRotate, G>(x, g, end - g < K ? int(end - g) : K, at);
  }
  for (int64_t g = end > g0 ? end : g0; g < g1; ++g) {
    encodeGroupValues<kBits, kSym>(x + g * G, groupLength(n, c, g), n, c, g, block, Noise{0, 0, 0});
  }
}

// The group-size dispatch; false for a size without a specialisation (the caller falls back).
template <int kBits, bool kSym, bool kRotate, class T>
QCOMM_ALWAYS_INLINE bool encodeGroupsBySize(const T* x, int64_t n, const CodecSpec& c, int64_t g0,
                                            int64_t g1, uint8_t* block) {
  switch (c.groupSize) {
    case 32:
      encodeGroupsFixed<kBits, kSym, kRotate, 32>(x, n, c, g0, g1, block);
      return true;
    case 64:
      encodeGroupsFixed<kBits, kSym, kRotate, 64>(x, n, c, g0, g1, block);
      return true;
    case 128:
      encodeGroupsFixed<kBits, kSym, kRotate, 128>(x, n, c, g0, g1, block);
      return true;
    case 256:
      encodeGroupsFixed<kBits, kSym, kRotate, 256>(x, n, c, g0, g1, block);
      return true;
    case 512:
      encodeGroupsFixed<kBits, kSym, kRotate, 512>(x, n, c, g0, g1, block);
      return true;
    case 1024:
      encodeGroupsFixed<kBits, kSym, kRotate, 1024>(x, n, c, g0, g1, block);
      return true;
    default:
      return false;
  }
}

// Encode groups g0..g1 of x[0..n) (rotated: each group rotated first) with deterministic
// rounding through the fixed-size loops; false (nothing written) for a group size they do not
// cover.
template <bool kRotate, class T>
QCOMM_ALWAYS_INLINE bool encodeGroupsFast(const T* x, int64_t n, const CodecSpec& c, int64_t g0,
                                          int64_t g1, uint8_t* block) {
  if (c.bits == 8) {
    return c.symmetric ? encodeGroupsBySize<8, true, kRotate>(x, n, c, g0, g1, block)
                       : encodeGroupsBySize<8, false, kRotate>(x, n, c, g0, g1, block);
  }
  return c.symmetric ? encodeGroupsBySize<4, true, kRotate>(x, n, c, g0, g1, block)
                     : encodeGroupsBySize<4, false, kRotate>(x, n, c, g0, g1, block);
}

}  // namespace cpu
}  // namespace qcomm
