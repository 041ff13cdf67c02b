// Eight-lane vectors for the CPU codec's loops, written once and compiled once per instruction set.
//
// A translation unit includes this (through codec_cpu_loops.h) after it has set the compiler's
// target for one instruction set and defined:
//   QCOMM_SIMD_LEVEL  0: the x86-64 baseline (SSE2), or any other CPU (plain C++);
//                     2: AVX2 with FMA and F16C;
//                     3: AVX-512 F/BW/VL/DQ (on 256-bit vectors: codec_cpu_avx512.cpp says why);
//   QCOMM_SIMD_NS     the namespace its copy of the loops lives in (one per unit, so the copies
//                     never meet at link time).
// Arithmetic is written with GCC's vector extensions: each lane is one IEEE single-precision
// operation, rounded to nearest as a scalar one is, so a vector of results is the scalar code's
// bits (no contraction: setup.py passes -ffp-contract=off; fma is explicit). Loads that widen,
// stores that narrow and the few shuffles GCC compiles poorly from generic code are intrinsics of
// the unit's level; every function has the same meaning at every level.
#pragma once

#include <stdint.h>
#include <string.h>

#include <type_traits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QCOMM_SIMD_X86 1
#else
#define QCOMM_SIMD_X86 0
#endif

#if !defined(QCOMM_SIMD_LEVEL) || !defined(QCOMM_SIMD_NS)
#error "codec_simd.h: define QCOMM_SIMD_LEVEL and QCOMM_SIMD_NS first (see codec_cpu_loops.h)"
#endif
#if QCOMM_SIMD_LEVEL > 0 && !QCOMM_SIMD_X86
#error "codec_simd.h: levels above 0 are x86 instruction sets"
#endif

// 32-byte vectors pass between always-inlined functions of the baseline copy: GCC warns that their
// calling convention differs with AVX (-Wpsabi), which is moot for code that is always inlined;
// codec_cpu_loops.h turns the warning off for its units.

namespace qcomm {
namespace QCOMM_SIMD_NS {
namespace simd {

#define QCOMM_SIMD_INLINE inline __attribute__((always_inline))

typedef float vf __attribute__((vector_size(32)));
typedef int32_t vi __attribute__((vector_size(32)));
typedef uint32_t vu __attribute__((vector_size(32)));
// half vectors: the baseline level's registers
typedef float vf4 __attribute__((vector_size(16)));
typedef int32_t vi4 __attribute__((vector_size(16)));

constexpr int kLanes = 8;

QCOMM_SIMD_INLINE vf splat(float x) { return vf{x, x, x, x, x, x, x, x}; }
QCOMM_SIMD_INLINE vi splati(int32_t x) { return vi{x, x, x, x, x, x, x, x}; }
QCOMM_SIMD_INLINE vf loadf(const float* p) {
  vf v;
  memcpy(&v, p, sizeof v);
  return v;
}
QCOMM_SIMD_INLINE void storef(float* p, vf v) { memcpy(p, &v, sizeof v); }
// storef with a non-temporal store (AVX2 and up; p 32-byte aligned): the line goes to memory
// without first being read into the cache. Such stores are ordered by streamFence(), which every
// loop that makes them runs before it returns. The baseline stores as storef does: its 16-byte
// stream stores measured slower than plain ones (benchmarks/results/02-cpu-codec.md, "Streamed
// decodes").
QCOMM_SIMD_INLINE void streamf(float* p, vf v) {
#if QCOMM_SIMD_LEVEL >= 2
  _mm256_stream_ps(p, (__m256)v);
#else
  storef(p, v);
#endif
}
QCOMM_SIMD_INLINE void streamFence() {
#if QCOMM_SIMD_LEVEL >= 2
  _mm_sfence();
#endif
}
QCOMM_SIMD_INLINE vi asInt(vf v) { return (vi)v; }
QCOMM_SIMD_INLINE vf asFloat(vi v) { return (vf)v; }

// The two 16-byte halves of an eight-lane vector, and the vector of two halves.
template <class V4, class V>
QCOMM_SIMD_INLINE void halves(V v, V4& lo, V4& hi) {
  memcpy(&lo, &v, 16);
  memcpy(&hi, reinterpret_cast<const char*>(&v) + 16, 16);
}
template <class V, class V4>
QCOMM_SIMD_INLINE V joined(V4 lo, V4 hi) {
  V v;
  memcpy(&v, &lo, 16);
  memcpy(reinterpret_cast<char*>(&v) + 16, &hi, 16);
  return v;
}

// Lane-wise minimum and maximum of the forms codec.h writes: a < b ? a : b is IEEE minps exactly
// (b when either is NaN or both are zero), so the result is the scalar expression's. GCC, which
// keeps -ftrapping-math here, compiles the ternaries to a compare and a blend: the instructions
// are spelled out where they exist.
QCOMM_SIMD_INLINE vf4 minOf(vf4 a, vf4 b) {
#if QCOMM_SIMD_X86
  return (vf4)_mm_min_ps((__m128)a, (__m128)b);
#else
  return a < b ? a : b;
#endif
}
QCOMM_SIMD_INLINE vf4 maxOf(vf4 a, vf4 b) {
#if QCOMM_SIMD_X86
  return (vf4)_mm_max_ps((__m128)a, (__m128)b);
#else
  return a > b ? a : b;
#endif
}
QCOMM_SIMD_INLINE vi4 maxOf(vi4 a, vi4 b) { return a > b ? a : b; }
QCOMM_SIMD_INLINE vf minOf(vf a, vf b) {
#if QCOMM_SIMD_LEVEL >= 2
  return (vf)_mm256_min_ps((__m256)a, (__m256)b);
#else
  vf4 a0, a1, b0, b1;
  halves(a, a0, a1);
  halves(b, b0, b1);
  return joined<vf>(minOf(a0, b0), minOf(a1, b1));
#endif
}
QCOMM_SIMD_INLINE vf maxOf(vf a, vf b) {
#if QCOMM_SIMD_LEVEL >= 2
  return (vf)_mm256_max_ps((__m256)a, (__m256)b);
#else
  vf4 a0, a1, b0, b1;
  halves(a, a0, a1);
  halves(b, b0, b1);
  return joined<vf>(maxOf(a0, b0), maxOf(a1, b1));
#endif
}
QCOMM_SIMD_INLINE vi maxOf(vi a, vi b) { return a > b ? a : b; }
struct Min {
  template <class V>
  QCOMM_SIMD_INLINE V operator()(V a, V b) const {
    return minOf(a, b);
  }
};
struct Max {
  template <class V>
  QCOMM_SIMD_INLINE V operator()(V a, V b) const {
    return maxOf(a, b);
  }
};

// ---- the eight elements at p as fp32 (exact widening) ----

QCOMM_SIMD_INLINE vf widen(const float* p) { return loadf(p); }

template <class T>
QCOMM_SIMD_INLINE vf widen(const T* p);

// bf16: the 16 bits are the top half of the float's.
template <>
QCOMM_SIMD_INLINE vf widen(const bf16_t* p) {
#if QCOMM_SIMD_LEVEL >= 2
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return (vf)_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
#elif QCOMM_SIMD_X86
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i z = _mm_setzero_si128();
  return (vf)joined<vi>(_mm_unpacklo_epi16(z, h), _mm_unpackhi_epi16(z, h));
#else
  vf r;
  for (int i = 0; i < kLanes; ++i) r[i] = toFloat(p[i]);
  return r;
#endif
}

// fp16: F16C's conversion where there is one (exact, as codec.h toFloat; a signalling NaN comes
// out quiet, which no encoded byte depends on: a NaN makes its group non-finite), else
// codec.h's cases as lane selects.
template <>
QCOMM_SIMD_INLINE vf widen(const fp16_t* p) {
#if QCOMM_SIMD_LEVEL >= 2
  return (vf)_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
#if QCOMM_SIMD_X86
  const __m128i u = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i z = _mm_setzero_si128();
  const vi h = joined<vi>(_mm_unpacklo_epi16(u, z), _mm_unpackhi_epi16(u, z));
#else
  vi h;
  for (int i = 0; i < kLanes; ++i) h[i] = p[i].bits;
#endif
  const vi sign = (h & 0x8000) << 16;
  const vi exp = (h >> 10) & 0x1f;
  const vi man = h & 0x3ff;
  const vi normal = ((h & 0x7fff) << 13) + (112 << 23);
  const vi special = 0x7f800000 | (man << 13);
  // zero or subnormal: man * 2^-24, exact and normal in fp32
  const vi small = asInt(__builtin_convertvector(man, vf) * 5.9604644775390625e-8f);
  const vi mag = exp == 0x1f ? special : (exp == 0 ? small : normal);
  return asFloat(sign | mag);
#endif
}

// ---- reductions of eight vectors at once ----
//
// reduce8(a, op): lane j of the result is op over the eight lanes of a[j]. Three rounds of
// pairwise shuffles halve the vectors each time (21 shuffles and min/max for eight groups, where
// a horizontal reduction per group takes 6 and a scalar extract). The lanes end in bit-reversed
// order; the caller's slot order (slotOf) undoes it. min and max do not depend on the order in
// which they meet their operands (up to the sign of a zero, which paramsFromMinMax normalises).
constexpr int slotOf(int group) { return ((group & 1) << 2) | (group & 2) | ((group >> 2) & 1); }

template <class V, class Op>
QCOMM_SIMD_INLINE V reduce8(const V* a, Op op) {
#if QCOMM_SIMD_LEVEL >= 2
  V b[4], c[2];
  for (int i = 0; i < 4; ++i) {
    b[i] = op(__builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11),
              __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15));
  }
  for (int i = 0; i < 2; ++i) {
    c[i] = op(__builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13),
              __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15));
  }
  return op(__builtin_shufflevector(c[0], c[1], 0, 8, 2, 10, 4, 12, 6, 14),
            __builtin_shufflevector(c[0], c[1], 1, 9, 3, 11, 5, 13, 7, 15));
#else
  // the same shuffles on the halves (GCC lowers eight-lane shuffles to single lanes without AVX)
  typedef typename std::conditional<std::is_same<V, vf>::value, vf4, vi4>::type V4;
  V4 b[4][2], c[2][2], r[2];
  for (int i = 0; i < 4; ++i) {
    for (int h = 0; h < 2; ++h) {
      V4 lo, hi;
      halves(a[2 * i + h], lo, hi);
      b[i][h] = op(lo, hi);
    }
  }
  for (int i = 0; i < 2; ++i) {
    for (int h = 0; h < 2; ++h) {
      const V4 x = b[2 * i][h], y = b[2 * i + 1][h];
      c[i][h] =
          op(__builtin_shufflevector(x, y, 0, 1, 4, 5), __builtin_shufflevector(x, y, 2, 3, 6, 7));
    }
  }
  for (int h = 0; h < 2; ++h) {
    r[h] = op(__builtin_shufflevector(c[0][h], c[1][h], 0, 4, 2, 6),
              __builtin_shufflevector(c[0][h], c[1][h], 1, 5, 3, 7));
  }
  return joined<V>(r[0], r[1]);
#endif
}

// Bit i set where lane i of the mask (0 or -1 per lane) is set.
QCOMM_SIMD_INLINE int maskBits(vi m) {
#if QCOMM_SIMD_LEVEL >= 2
  return _mm256_movemask_ps((__m256)m);
#elif QCOMM_SIMD_X86
  __m128 lo, hi;
  halves(m, lo, hi);
  return _mm_movemask_ps(lo) | (_mm_movemask_ps(hi) << 4);
#else
  int r = 0;
  for (int i = 0; i < kLanes; ++i) r |= (m[i] != 0) << i;
  return r;
#endif
}

// ---- codes: int32 lanes to bytes and back ----
//
// storeCodes8<kSigned>(o, c): o[0..32) = the 32 codes of c[0..4), each lane a value that fits
// the byte (0..255, or -128..127 when kSigned, two's complement), in lane order. Saturating packs
// keep such values unchanged.
#if QCOMM_SIMD_LEVEL >= 2
template <bool kSigned>
QCOMM_SIMD_INLINE __m256i packedCodes(const vi* c) {
  const __m256i a = _mm256_packs_epi32((__m256i)c[0], (__m256i)c[1]);
  const __m256i b = _mm256_packs_epi32((__m256i)c[2], (__m256i)c[3]);
  const __m256i p = kSigned ? _mm256_packs_epi16(a, b) : _mm256_packus_epi16(a, b);
  // the packs work within 128-bit halves: dwords 0..7 hold c0 0-3, c1 0-3, c2 0-3, c3 0-3, then
  // the upper four of each
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif

template <bool kSigned>
QCOMM_SIMD_INLINE void storeCodes8(uint8_t* o, const vi* c) {
#if QCOMM_SIMD_LEVEL >= 2
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), packedCodes<kSigned>(c));
#elif QCOMM_SIMD_X86
  for (int k = 0; k < 4; k += 2) {
    __m128i h[4];
    halves(c[k], h[0], h[1]);
    halves(c[k + 1], h[2], h[3]);
    const __m128i a = _mm_packs_epi32(h[0], h[1]), b = _mm_packs_epi32(h[2], h[3]);
    const __m128i p = kSigned ? _mm_packs_epi16(a, b) : _mm_packus_epi16(a, b);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 8 * k), p);
  }
#else
  for (int k = 0; k < 4; ++k) {
    for (int i = 0; i < kLanes; ++i) o[8 * k + i] = uint8_t(c[k][i]);
  }
#endif
}

// storeCodes4(o, c): o[0..16) = the 32 codes of c[0..4) (their low four bits; a lane holds -8..15),
// two to a byte, the even element in the low nibble: the codes as bytes, then each 16-bit pair
// (even | odd << 8) becomes (even & 15) | (odd & 15) << 4.
QCOMM_SIMD_INLINE void storeCodes4(uint8_t* o, const vi* c) {
#if QCOMM_SIMD_LEVEL >= 2
  const __m256i w = packedCodes<true>(c);
  const __m256i lo = _mm256_and_si256(w, _mm256_set1_epi16(0x000f));
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), _mm256_set1_epi16(0x00f0));
  const __m256i n = _mm256_or_si256(lo, hi);
#if QCOMM_SIMD_LEVEL >= 3
  // (the zero-masked form: GCC 12 warns of its own header's undefined source in the other)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm256_maskz_cvtepi16_epi8(0xffff, n));
#else
  _mm_storeu_si128(reinterpret_cast<__m128i*>(o),
                   _mm_packus_epi16(_mm256_castsi256_si128(n), _mm256_extracti128_si256(n, 1)));
#endif
#else
  alignas(16) uint8_t bytes[32];
  storeCodes8<true>(bytes, c);
#if QCOMM_SIMD_X86
  const __m128i m0 = _mm_set1_epi16(0x000f), m1 = _mm_set1_epi16(0x00f0);
  __m128i n[2];
  for (int k = 0; k < 2; ++k) {
    const __m128i w = _mm_load_si128(reinterpret_cast<const __m128i*>(bytes + 16 * k));
    n[k] = _mm_or_si128(_mm_and_si128(w, m0), _mm_and_si128(_mm_srli_epi16(w, 4), m1));
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm_packus_epi16(n[0], n[1]));
#else
  for (int i = 0; i < 16; ++i) o[i] = uint8_t((bytes[2 * i] & 15) | ((bytes[2 * i + 1] & 15) << 4));
#endif
#endif
}

// The eight bytes at p as int32 lanes: zero-extended, or sign-extended when kSigned.
template <bool kSigned>
QCOMM_SIMD_INLINE vi loadBytes(const uint8_t* p) {
#if QCOMM_SIMD_LEVEL >= 2
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return (vi)(kSigned ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
#elif QCOMM_SIMD_X86
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  // bytes to the top of 32-bit lanes, then shifted down (arithmetic: signed)
  const __m128i z = _mm_setzero_si128();
  const __m128i w = _mm_unpacklo_epi8(z, b);
  __m128i lo = _mm_unpacklo_epi16(z, w), hi = _mm_unpackhi_epi16(z, w);
  lo = kSigned ? _mm_srai_epi32(lo, 24) : _mm_srli_epi32(lo, 24);
  hi = kSigned ? _mm_srai_epi32(hi, 24) : _mm_srli_epi32(hi, 24);
  return joined<vi>(lo, hi);
#else
  vi r;
  for (int i = 0; i < kLanes; ++i) r[i] = kSigned ? int32_t(int8_t(p[i])) : int32_t(p[i]);
  return r;
#endif
}

// The 32 four-bit codes of the 16 bytes at p (even element in the low nibble) as four vectors
// of int32 lanes, 0..15.
QCOMM_SIMD_INLINE void loadNibbles(const uint8_t* p, vi* c) {
  alignas(16) uint8_t codes[32];
#if QCOMM_SIMD_X86
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
  _mm_store_si128(reinterpret_cast<__m128i*>(codes), _mm_unpacklo_epi8(lo, hi));
  _mm_store_si128(reinterpret_cast<__m128i*>(codes + 16), _mm_unpackhi_epi8(lo, hi));
#else
  for (int i = 0; i < 16; ++i) {
    codes[2 * i] = p[i] & 15;
    codes[2 * i + 1] = p[i] >> 4;
  }
#endif
  for (int k = 0; k < 4; ++k) c[k] = loadBytes<false>(codes + 8 * k);
}

// floor of v, for |v| below 2^22 (the stochastic quantizer's t + u): exact.
QCOMM_SIMD_INLINE vf floorOf(vf v) {
#if QCOMM_SIMD_LEVEL >= 2
  return (vf)_mm256_floor_ps((__m256)v);
#else
  const vf magic = splat(12582912.0f);
  const vf r = (v + magic) - magic;  // v rounded to nearest, exact below 2^22
  return r > v ? r - 1.0f : r;
#endif
}

}  // namespace simd
}  // namespace QCOMM_SIMD_NS
}  // namespace qcomm
