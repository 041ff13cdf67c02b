// The CPU codec's loops over whole groups of a size fixed at compile time, on codec_simd.h's
// vectors: the bytes and values of codec.h's encodeGroupValues and decodeGroupValues, faster.
//
// codec.h is the definition of the wire format, written for any group length and shared with the
// CUDA kernels. Compiled for the CPU as it is, it leaves most cycles unused: the per-group
// parameters are a chain of dependent scalar work (a horizontal reduction, two divisions) between
// one group's values and its codes, and the compiler vectorizes the min/max pass, the clamp and
// the packing poorly. Here, for full groups of 32..1024 (every size the config allows):
//   * groups go eight at a time, one per vector lane of their parameters: each group's values are
//     reduced to one vector of partial minima and maxima, the eight vectors are reduced together
//     (simd::reduce8), and the scales and midpoints of all eight are computed by vector
//     divisions, as paramsFromMinMax / paramsFromAbsmax compute one;
//   * the min/max pass reads the values once (a bf16/fp16 group is widened on the fly) and the
//     quantizer reads them again from L1 or L2 (eight groups of 1024 fp32 values are 32 KiB);
//   * the quantizer is quantizeScaled's: an IEEE division by the scale, the clamp as float
//     min/max, roundHalfEven's first addition, whose bits hold the code, packed 32 at a time;
//   * non-finite and constant groups are found once per eight groups (a lane mask) and written as
//     encodeGroupValues writes them;
//   * stochastic rounding draws codec.h's noiseAt for eight elements at once.
// A short last group (and a group size outside 32..1024) goes through codec.h unchanged.
// tests/codec/test_cpu_groups.py and test_cpu_isa.py compare every path, at every level this CPU
// has, with the reference model.
#pragma once

#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "codec/codec.h"
#include "codec/codec_simd.h"

namespace qcomm {
namespace QCOMM_SIMD_NS {

using simd::vf;
using simd::vi;
using simd::vu;

constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23, codec.h roundHalfEven's
constexpr int32_t kMagicBits = 0x4b400000;
constexpr int kBlock = simd::kLanes;  // groups whose parameters are computed together

// codec.h hash32, lane by lane.
QCOMM_SIMD_INLINE vu hash32x8(vu x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// codec.h noiseAt for the eight elements idx..idx+7 of the block.
QCOMM_SIMD_INLINE vf noise8(const Noise& nz, int64_t idx) {
  const uint64_t i0 = uint64_t(nz.base + idx);
  const vu first = vu{0, 0, 0, 0, 0, 0, 0, 0} + uint32_t(i0);
  const vu lo = first + vu{0, 1, 2, 3, 4, 5, 6, 7};
  const vu carry = (vu)(lo < first);  // all ones where the low word wrapped
  const vu hi = (vu{0, 0, 0, 0, 0, 0, 0, 0} + uint32_t(i0 >> 32)) - carry;
  const vu h = hash32x8(hash32x8(lo) ^ hi ^ nz.salt);
  return __builtin_convertvector((vi)(h >> 8), vf) * 5.9604644775390625e-8f;
}

// The parameters of a block of up to eight groups, lane j for group j.
struct BlockParams {
  alignas(32) float scale[kBlock];
  alignas(32) float mid[kBlock];
  int ordinary;  // bit j: group j's scale is finite and nonzero (else it is written whole)
  int inRange;   // bit j: no value of group j needs quantizeScaled's clamp (below)
};

// groupParams of the eight groups at v[0..8) (G values of T each), eight lanes at a time. Min and
// max are the same values in any order; a NaN or an Inf shows in the maximum of the magnitudes'
// bits (at least 0x7f800000, the bits of +Inf), as codec.h's `!(|x| <= FLT_MAX)` flags it.
template <int kBits, bool kSym, int G, class T>
QCOMM_SIMD_INLINE void blockParams(const T* const* v, BlockParams& bp) {
  vi mag[kBlock];
  vf lo[kBlock], hi[kBlock];
  for (int j = 0; j < kBlock; ++j) {
    const int s = simd::slotOf(j);
#if QCOMM_SIMD_LEVEL >= 2
    const vf first = simd::widen(v[j]);
    vi m = simd::asInt(first) & 0x7fffffff;
    vf l = first, h = first;
    for (int i = simd::kLanes; i < G; i += simd::kLanes) {
      const vf x = simd::widen(v[j] + i);
      m = simd::maxOf(m, simd::asInt(x) & 0x7fffffff);
      if (!kSym) {
        l = simd::minOf(l, x);
        h = simd::maxOf(h, x);
      }
    }
    mag[s] = m;
    lo[s] = l;
    hi[s] = h;
#else
    // On half vectors (GCC keeps a loop-carried eight-lane vector in memory without AVX), the
    // flag as codec.h's !(|x| <= FLT_MAX) (one compare: SSE2 has no 32-bit integer max) and the
    // magnitudes' maximum as floats: mag is then the bits of the absmax, or 0x7f800000 (+Inf's)
    // for a group holding a NaN or an Inf, the maximum of the bits the levels above compute.
    const simd::vf4 kMax = simd::vf4{0, 0, 0, 0} + 3.40282346638528859811704183484516925e+38f;
    simd::vf4 l[2], h[2], a[2];
    simd::vi4 bad[2];
    simd::halves(simd::widen(v[j]), l[0], l[1]);
    for (int k = 0; k < 2; ++k) {
      h[k] = l[k];
      a[k] = (simd::vf4)((simd::vi4)l[k] & 0x7fffffff);
      bad[k] = ~(a[k] <= kMax);
    }
    for (int i = simd::kLanes; i < G; i += simd::kLanes) {
      simd::vf4 x[2];
      simd::halves(simd::widen(v[j] + i), x[0], x[1]);
      for (int k = 0; k < 2; ++k) {
        const simd::vf4 ax = (simd::vf4)((simd::vi4)x[k] & 0x7fffffff);
        bad[k] |= ~(ax <= kMax);
        if (kSym) {
          a[k] = simd::maxOf(a[k], ax);
        } else {
          l[k] = simd::minOf(l[k], x[k]);
          h[k] = simd::maxOf(h[k], x[k]);
        }
      }
    }
    simd::vi4 m[2];
    for (int k = 0; k < 2; ++k) {
      const simd::vi4 inf = simd::vi4{0, 0, 0, 0} + 0x7f800000;
      m[k] = bad[k] ? inf : (kSym ? (simd::vi4)a[k] : simd::vi4{0, 0, 0, 0});
    }
    mag[s] = simd::joined<vi>(m[0], m[1]);
    lo[s] = simd::joined<vf>(l[0], l[1]);
    hi[s] = simd::joined<vf>(h[0], h[1]);
#endif
  }
  const vi most = simd::reduce8(mag, simd::Max());
  const vi bad = most >= 0x7f800000;
  const vf nan = simd::asFloat(simd::splati(0x7fc00000));
  // Which groups need no clamp (bit j of inRange; others keep quantizeScaled's). Symmetric, with
  // a normal scale: s = RN(absmax / qmax) is at least (absmax / qmax)(1 - 2^-24), so
  // |v| / s < qmax (1 + 2^-23) for |v| <= absmax; RN of that is at most two ulps above qmax
  // (2^-17 each for 127, 2^-21 for 7), far below qmax + 1/2, so the rounding gives the code of
  // the clamped t (a subnormal scale carries no such relative bound). Asymmetric (codec.h
  // asymCodesInRange's argument, with the IEEE division): t(v) = RN(RN(RN(v - mid) / s) + L/2)
  // never decreases as v grows (each rounding is monotone, s > 0), so if t(lo) >= -1/2 and
  // t(hi) < L + 1/2, every value's t lies in [-1/2, L + 1/2), which rounds (ties to even) to a
  // code in [0, L]: the code of t clamped to [0, L] first. Almost every group passes; ones a few
  // ulps wide, whose scale is mostly rounding, can fail.
  vf scale, mid = simd::splat(0.0f);
  vi inRange;
  if (kSym) {
    scale = bad ? nan : (simd::asFloat(most) / qmaxSym(kBits)) + 0.0f;
    inRange = scale >= 1.17549435e-38f;  // FLT_MIN
  } else {
    const vf l = simd::reduce8(lo, simd::Min());
    const vf h = simd::reduce8(hi, simd::Max());
    const float levels = levelsAsym(kBits);
    // "+ 0": -0 to +0, as paramsFromMinMax
    scale = bad ? nan : (h / levels - l / levels) + 0.0f;
    mid = bad ? simd::splat(0.0f) : (l * 0.5f + h * 0.5f) + 0.0f;
    const vf tl = (l - mid) / scale + levels * 0.5f, th = (h - mid) / scale + levels * 0.5f;
    inRange = (tl >= -0.5f) & (th < levels + 0.5f);
  }
  simd::storef(bp.scale, scale);
  simd::storef(bp.mid, mid);
  bp.ordinary = simd::maskBits((scale == scale) & (scale != 0.0f));
  bp.inRange = simd::maskBits(inRange);
}

// The stored codes of the G values at v, a group of finite values with finite nonzero parameters
// s and m, as quantizeScaled (or, with kStochastic, quantizeStochastic with codec.h's noise for
// elements begin..) gives them; out: G * kBits / 8 bytes.
template <int kBits, bool kSym, bool kStochastic, bool kClamp, int G, class T>
QCOMM_SIMD_INLINE void groupCodes(const T* v, float s, float m, uint8_t* out, const Noise& noise,
                                  int64_t begin) {
  const float top = kSym ? qmaxSym(kBits) : levelsAsym(kBits);
  const float bottom = kSym ? -top : 0.0f;
  const vf vs = simd::splat(s), vm = simd::splat(m);
  for (int i = 0; i < G; i += 4 * simd::kLanes) {
    vi c[4];
    for (int k = 0; k < 4; ++k) {
      const int e = i + k * simd::kLanes;
      vf t = kSym ? simd::widen(v + e) / vs : (simd::widen(v + e) - vm) / vs;
      if (!kSym) t = t + levelsAsym(kBits) * 0.5f;
      if (kClamp) t = simd::maxOf(simd::minOf(t, simd::splat(top)), simd::splat(bottom));
      if (kStochastic) {
        const vf q = simd::floorOf(t + noise8(noise, begin + e));
        t = simd::minOf(q, simd::splat(top));
      }
      // t is now an integer's float or is rounded to one, to nearest even, by the addition
      c[k] = simd::asInt(t + kMagic) - kMagicBits;
    }
    if (kBits == 8) {
      simd::storeCodes8<kSym>(out + i, c);
    } else {
      simd::storeCodes4(out + i / 2, c);
    }
  }
}

// Where a block's parameters and codes go: the encoded block's scale and midpoint arrays and its
// data section.
struct BlockLayout {
  float* scales;
  float* mids;  // asymmetric only
  uint8_t* data;
};

QCOMM_SIMD_INLINE BlockLayout blockLayout(uint8_t* block, int64_t n, const CodecSpec& c) {
  float* scales = reinterpret_cast<float*>(block);
  return BlockLayout{scales, scales + numGroups(n, c), block + dataOffset(n, c)};
}

// Encode the k (<= 8) full groups g0..g0+k whose G values are at v[0..k) (the message's, or
// rotated copies; v[k..8) repeat v[0], lanes computed and never stored): their parameters and
// codes, the bytes of encodeGroupValues for each.
template <int kBits, bool kSym, bool kStochastic, int G, class V>
void encodeBlockOfGroups(const V* const* v, int64_t g0, int k, const BlockLayout& at,
                         const Noise& noise) {
  BlockParams bp;
  blockParams<kBits, kSym, G>(v, bp);
  if (k == kBlock) {
    memcpy(at.scales + g0, bp.scale, sizeof bp.scale);
    if (!kSym) memcpy(at.mids + g0, bp.mid, sizeof bp.mid);
  } else {
    for (int j = 0; j < k; ++j) {
      at.scales[g0 + j] = bp.scale[j];
      if (!kSym) at.mids[g0 + j] = bp.mid[j];
    }
  }
  for (int j = 0; j < k; ++j) {
    uint8_t* out = at.data + (g0 + j) * (G * kBits / 8);
    if (!((bp.ordinary >> j) & 1)) {
      // non-finite (NaN scale): code 0; constant (zero scale): the code of mid
      const uint32_t code = bp.scale[j] == bp.scale[j] ? zeroScaleCode<kBits, kSym>() : 0u;
      memset(out, kBits == 8 ? int(code) : int(code | (code << 4)), G * kBits / 8);
      continue;
    }
    const int64_t begin = (g0 + j) * G;
    if (!kStochastic && ((bp.inRange >> j) & 1)) {
      groupCodes<kBits, kSym, false, false, G>(v[j], bp.scale[j], bp.mid[j], out, noise, begin);
    } else {
      groupCodes<kBits, kSym, kStochastic, true, G>(v[j], bp.scale[j], bp.mid[j], out, noise,
                                                    begin);
    }
  }
}

// Encode groups g0..g1 of x[0..n): full groups eight at a time, a short last group through
// codec.h's encodeGroupValues (stochastic too: the same noise for the same index). kRotate: each
// group rotated first (codec.h rotateGroupInto; n is then a multiple of G), the bytes of
// encodeRotatedGroup.
template <int kBits, bool kSym, bool kRotate, bool kStochastic, int G, class T>
void encodeGroupsFixed(const T* x, int64_t n, const CodecSpec& c, int64_t g0, int64_t g1,
                       uint8_t* block, const Noise& noise) {
  const BlockLayout at = blockLayout(block, n, c);
  const int64_t full = n / G;
  const int64_t end = g1 < full ? g1 : full;
  // fp16 without F16C: widened once into the buffer, not once per pass (the conversion's lane
  // selects are most of the work)
  constexpr bool kWidenFirst = QCOMM_SIMD_LEVEL < 2 && std::is_same<T, fp16_t>::value;
  for (int64_t g = g0; g < end; g += kBlock) {
    const int k = end - g < kBlock ? int(end - g) : kBlock;
    if constexpr (kRotate || kWidenFirst) {
      alignas(32) float buf[kBlock * G];
      const float* v[kBlock];
      for (int j = 0; j < kBlock; ++j) {
        if (j < k && kRotate) rotateGroupInto(x + (g + j) * G, G, buf + j * G);
        if (j < k && !kRotate) {
          for (int i = 0; i < G; i += simd::kLanes) {
            simd::storef(buf + j * G + i, simd::widen(x + (g + j) * G + i));
          }
        }
        v[j] = buf + (j < k ? j : 0) * G;
      }
      encodeBlockOfGroups<kBits, kSym, kStochastic, G>(v, g, k, at, noise);
    } else {
      const T* v[kBlock];
      for (int j = 0; j < kBlock; ++j) v[j] = x + (g + (j < k ? j : 0)) * G;
      encodeBlockOfGroups<kBits, kSym, kStochastic, G>(v, g, k, at, noise);
    }
  }
  for (int64_t g = end > g0 ? end : g0; g < g1; ++g) {
    encodeGroupValues<kBits, kSym>(x + g * G, groupLength(n, c, g), n, c, g, block, noise);
  }
}

// The 32 values x^ of codes i..i+32 of a group whose codes start at `codes` (parameters s, m,
// splatted): decodeGroupValues' values (dequantizeUnclamped, then clampToFinite; a NaN passes:
// minOf(top, NaN) is NaN).
template <int kBits, bool kSym>
QCOMM_SIMD_INLINE void dequantize32(const uint8_t* codes, int i, vf vs, vf vm, vf* y) {
  const float kMax = 3.40282346638528859811704183484516925e+38f;
  vi c[4];
  if (kBits == 8) {
    for (int k = 0; k < 4; ++k) c[k] = simd::loadBytes<kSym>(codes + i + k * simd::kLanes);
  } else {
    simd::loadNibbles(codes + i / 2, c);
    if (kSym) {
      for (int k = 0; k < 4; ++k) c[k] = (c[k] ^ 8) - 8;
    }
  }
  for (int k = 0; k < 4; ++k) {
    const vf q = __builtin_convertvector(c[k], vf);
    const vf v = kSym ? q * vs : vm + (q - levelsAsym(kBits) * 0.5f) * vs;
    y[k] = simd::maxOf(simd::splat(-kMax), simd::minOf(simd::splat(kMax), v));
  }
}

// Decode the full group of G codes at `codes` with parameters s, m into o[0..G) (o[i] + x^ with
// kAccumulate): decodeGroupValues' values. kStream: non-temporal stores (o 32-byte aligned; the
// caller fences).
template <int kBits, bool kSym, bool kAccumulate, int G, bool kStream = false>
QCOMM_SIMD_INLINE void decodeGroupFixed(const uint8_t* codes, float s, float m, float* o) {
  static_assert(!(kStream && kAccumulate), "a streamed decode overwrites");
  const vf vs = simd::splat(s), vm = simd::splat(m);
  for (int i = 0; i < G; i += 4 * simd::kLanes) {
    vf y[4];
    dequantize32<kBits, kSym>(codes, i, vs, vm, y);
    for (int k = 0; k < 4; ++k) {
      float* p = o + i + k * simd::kLanes;
      if (kStream) {
        simd::streamf(p, y[k]);
      } else {
        simd::storef(p, kAccumulate ? simd::loadf(p) + y[k] : y[k]);
      }
    }
  }
}

// Decode groups g0..g1 of an encoded block of n elements into out (out += x^ with kAccumulate):
// full groups here, a short last group through codec.h. kStream: the full groups with
// non-temporal stores (out 32-byte aligned), fenced before the return.
template <int kBits, bool kSym, bool kAccumulate, int G, bool kStream = false>
void decodeGroupsFixed(const uint8_t* block, int64_t n, const CodecSpec& c, int64_t g0, int64_t g1,
                       float* out) {
  const BlockLayout at = blockLayout(const_cast<uint8_t*>(block), n, c);
  const int64_t full = n / G;
  const int64_t end = g1 < full ? g1 : full;
  for (int64_t g = g0; g < end; ++g) {
    decodeGroupFixed<kBits, kSym, kAccumulate, G, kStream>(
        at.data + g * (G * kBits / 8), at.scales[g], kSym ? 0.0f : at.mids[g], out + g * G);
  }
  if (kStream) simd::streamFence();
  for (int64_t g = end > g0 ? end : g0; g < g1; ++g) {
    decodeGroupT<kBits, kSym, kAccumulate>(block, n, c, g, out);
  }
}

// out[groups g0..g1] = x^_0 + x^_1 + ... + x^_{count-1}, the decoded values of the encoded blocks
// blocks[0..count) of n elements each, summed in fp32 in that order (out + x^_0 + ... with
// kAccumulate): the bits of a decode and count - 1 decodes with accumulate (count decodes with
// accumulate), in one pass over out instead of count.
template <int kBits, bool kSym, int G, bool kAccumulate>
void decodeSumGroupsFixed(const uint8_t* const* blocks, int count, int64_t n, const CodecSpec& c,
                          int64_t g0, int64_t g1, float* out) {
  const int64_t groups = numGroups(n, c), data = dataOffset(n, c);
  const int64_t full = n / G;
  const int64_t end = g1 < full ? g1 : full;
  for (int64_t g = g0; g < end; ++g) {
    auto values = [&](int j, int i, vf* y) {
      const float* meta = reinterpret_cast<const float*>(blocks[j]);
      const vf vs = simd::splat(meta[g]), vm = simd::splat(kSym ? 0.0f : meta[groups + g]);
      dequantize32<kBits, kSym>(blocks[j] + data + g * (G * kBits / 8), i, vs, vm, y);
    };
    for (int i = 0; i < G; i += 4 * simd::kLanes) {
      vf acc[4];
      values(0, i, acc);
      if (kAccumulate) {
        for (int k = 0; k < 4; ++k)
          acc[k] = simd::loadf(out + g * G + i + k * simd::kLanes) + acc[k];
      }
      for (int j = 1; j < count; ++j) {
        vf y[4];
        values(j, i, y);
        for (int k = 0; k < 4; ++k) acc[k] = acc[k] + y[k];
      }
      for (int k = 0; k < 4; ++k) simd::storef(out + g * G + i + k * simd::kLanes, acc[k]);
    }
  }
  for (int64_t g = end > g0 ? end : g0; g < g1; ++g) {
    decodeGroupT<kBits, kSym, kAccumulate>(blocks[0], n, c, g, out);
    for (int j = 1; j < count; ++j) decodeGroupT<kBits, kSym, true>(blocks[j], n, c, g, out);
  }
}

// Decode group g (a full group of G) and rotate it back: out[group] = H x^ / G.
template <int kBits, bool kSym, int G>
void decodeRotatedGroupFixed(const uint8_t* block, int64_t n, const CodecSpec& c, int64_t g,
                             float* out) {
  const BlockLayout at = blockLayout(const_cast<uint8_t*>(block), n, c);
  alignas(32) float buf[G];
  decodeGroupFixed<kBits, kSym, false, G>(at.data + g * (G * kBits / 8), at.scales[g],
                                          kSym ? 0.0f : at.mids[g], buf);
  unrotateGroupInto(buf, G, out + g * G);
}

// f.template operator()<G>() for the group size of c, 32..1024; false for another size.
template <class F>
QCOMM_SIMD_INLINE bool withGroupSize(const CodecSpec& c, F&& f) {
  switch (c.groupSize) {
    case 32:
      f(std::integral_constant<int, 32>());
      return true;
    case 64:
      f(std::integral_constant<int, 64>());
      return true;
    case 128:
      f(std::integral_constant<int, 128>());
      return true;
    case 256:
      f(std::integral_constant<int, 256>());
      return true;
    case 512:
      f(std::integral_constant<int, 512>());
      return true;
    case 1024:
      f(std::integral_constant<int, 1024>());
      return true;
    default:
      return false;
  }
}

// f(bits, symmetric) as compile-time constants, for the spec's 4 or 8 bits.
template <class F>
QCOMM_SIMD_INLINE void withCodec(const CodecSpec& c, F&& f) {
  using B8 = std::integral_constant<int, 8>;
  using B4 = std::integral_constant<int, 4>;
  using S = std::true_type;
  using A = std::false_type;
  if (c.bits == 8) {
    c.symmetric ? f(B8(), S()) : f(B8(), A());
  } else {
    c.symmetric ? f(B4(), S()) : f(B4(), A());
  }
}

// f(group size, bits, symmetric) as compile-time constants; false for a group size the fixed-size
// loops do not cover.
template <class F>
QCOMM_SIMD_INLINE bool withFixedCodec(const CodecSpec& c, F&& f) {
  return withGroupSize(c, [&](auto size) { withCodec(c, [&](auto b, auto s) { f(size, b, s); }); });
}

}  // namespace QCOMM_SIMD_NS
}  // namespace qcomm
