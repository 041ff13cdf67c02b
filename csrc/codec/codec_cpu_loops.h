// The group loops of one instruction set (codec_cpu_isa.h's GroupLoops): included once by each of
// codec_cpu_generic.cpp, codec_cpu_avx2.cpp and codec_cpu_avx512.cpp, after the unit has
// included its standard headers and codec.h, set its compiler target and defined
// QCOMM_SIMD_LEVEL and QCOMM_SIMD_NS (codec_simd.h). Full groups of 32..1024 take the
// fixed-size loops of codec_cpu_groups.h; everything else codec.h's per-group functions, which
// are inlined here and so compiled for the unit's instruction set too.
#pragma once

// codec_simd.h says why; for the rest of the unit, as GCC warns when it emits a function
#pragma GCC diagnostic ignored "-Wpsabi"

#include "codec/codec.h"
#include "codec/codec_cpu_groups.h"
#include "codec/codec_cpu_isa.h"

namespace qcomm {
namespace QCOMM_SIMD_NS {

// f(x as a pointer to the elements of `dtype`). codec_cpu.cpp's dispatching code has its own: this
// one is in the instruction set's namespace so that each unit's instantiations stay its own (one
// template shared by units of different targets could be linked with the widest one's code).
template <class F>
QCOMM_SIMD_INLINE void withElements(const void* x, int32_t dtype, F&& f) {
  switch (dtype) {
    case kFloat32:
      f(static_cast<const float*>(x));
      break;
    case kFloat16:
      f(static_cast<const fp16_t*>(x));
      break;
    default:
      f(static_cast<const bf16_t*>(x));
  }
}

// Encode groups g0..g1 through the fixed-size loops; false (nothing written) for a group size
// they do not cover.
template <bool kRotate, class T>
bool encodeFast(const T* x, int64_t n, const CodecSpec& c, int64_t g0, int64_t g1, uint8_t* dst,
                const Noise& noise) {
  return withFixedCodec(c, [&](auto size, auto bits, auto sym) {
    constexpr int G = decltype(size)::value, B = decltype(bits)::value;
    constexpr bool S = decltype(sym)::value;
    if (noise.on) {
      encodeGroupsFixed<B, S, kRotate, true, G>(x, n, c, g0, g1, dst, noise);
    } else {
      encodeGroupsFixed<B, S, kRotate, false, G>(x, n, c, g0, g1, dst, noise);
    }
  });
}

void encodeRange(const void* x, int32_t dtype, int64_t n, const CodecSpec& c, int64_t g0,
                 int64_t g1, uint8_t* dst, const Noise& noise) {
  withElements(x, dtype, [&](auto* p) {
    if (encodeFast<false>(p, n, c, g0, g1, dst, noise)) return;
    for (int64_t g = g0; g < g1; ++g) encodeGroup(p, n, c, g, dst, noise);
  });
}

void encodeRotatedRange(const void* x, int32_t dtype, int64_t n, const CodecSpec& c, int64_t g0,
                        int64_t g1, uint8_t* dst, const Noise& noise) {
  withElements(x, dtype, [&](auto* p) {
    if (encodeFast<true>(p, n, c, g0, g1, dst, noise)) return;
    for (int64_t g = g0; g < g1; ++g) encodeRotatedGroup(p, n, c, g, dst, noise);
  });
}

void decodeRange(const uint8_t* src, int64_t n, const CodecSpec& c, int64_t g0, int64_t g1,
                 float* out, bool accumulate) {
  const bool fast = withFixedCodec(c, [&](auto size, auto bits, auto sym) {
    constexpr int G = decltype(size)::value, B = decltype(bits)::value;
    constexpr bool S = decltype(sym)::value;
    if (accumulate) {
      decodeGroupsFixed<B, S, true, G>(src, n, c, g0, g1, out);
    } else {
      decodeGroupsFixed<B, S, false, G>(src, n, c, g0, g1, out);
    }
  });
  if (fast) return;
  for (int64_t g = g0; g < g1; ++g) {
    if (accumulate) {
      decodeGroup<true>(src, n, c, g, out);
    } else {
      decodeGroup<false>(src, n, c, g, out);
    }
  }
}

// decodeRange's overwrite with non-temporal stores (out 32-byte aligned), for a large output that
// nothing reads soon: its lines are written without first being read (the baseline's streamf is a
// plain store). Formats without a fixed-size loop decode as decodeRange does.
void decodeStreamedRange(const uint8_t* src, int64_t n, const CodecSpec& c, int64_t g0, int64_t g1,
                         float* out) {
  const bool fast = withFixedCodec(c, [&](auto size, auto bits, auto sym) {
    constexpr int G = decltype(size)::value, B = decltype(bits)::value;
    decodeGroupsFixed<B, decltype(sym)::value, false, G, true>(src, n, c, g0, g1, out);
  });
  if (!fast) decodeRange(src, n, c, g0, g1, out, false);
}

// The sum of the copies. With AVX2 and above, decodeSumGroupsFixed: each group of every copy
// decoded and added in registers, one pass over out (1.3x-1.5x two whole decodes at 64 MiB,
// benchmarks/results/02-cpu-codec.md). The baseline's 16 registers of 128 bits hold too little of
// that loop (0.90x of two whole decodes, 64 MiB bf16 8-bit; 0.91x-0.95x decoded a few groups at a
// time): it decodes each copy over the whole range in turn, as CodecOps::decodeSum does. The same
// bits either way.
void decodeSumRange(const uint8_t* const* blocks, int count, int64_t n, const CodecSpec& c,
                    int64_t g0, int64_t g1, float* out, bool accumulate) {
  if (QCOMM_SIMD_LEVEL >= 2) {
    const bool fast = withFixedCodec(c, [&](auto size, auto bits, auto sym) {
      constexpr int G = decltype(size)::value, B = decltype(bits)::value;
      constexpr bool S = decltype(sym)::value;
      if (accumulate) {
        decodeSumGroupsFixed<B, S, G, true>(blocks, count, n, c, g0, g1, out);
      } else {
        decodeSumGroupsFixed<B, S, G, false>(blocks, count, n, c, g0, g1, out);
      }
    });
    if (fast) return;
  }
  for (int j = 0; j < count; ++j) decodeRange(blocks[j], n, c, g0, g1, out, accumulate || j > 0);
}

void decodeRotatedRange(const uint8_t* src, int64_t n, const CodecSpec& c, int64_t g0, int64_t g1,
                        float* out) {
  const bool fast = withFixedCodec(c, [&](auto size, auto bits, auto sym) {
    constexpr int G = decltype(size)::value, B = decltype(bits)::value;
    constexpr bool S = decltype(sym)::value;
    for (int64_t g = g0; g < g1; ++g) decodeRotatedGroupFixed<B, S, G>(src, n, c, g, out);
  });
  if (fast) return;
  for (int64_t g = g0; g < g1; ++g) decodeRotatedGroup(src, n, c, g, out);
}

// out[i] = float(x[i]) (or out[i] + float(x[i])) for i in [b, e): eight at a time (fp16 through
// F16C where the level has it), the rest one by one; the same values either way (exact widening).
// The baseline widens fp32 and bf16 one by one, a loop GCC vectorizes as well (the eight-lane
// form measured 0.89x-0.96x in the ring hop there).
void widenRange(const void* x, int32_t dtype, int64_t b, int64_t e, float* out, bool accumulate) {
  withElements(x, dtype, [&](auto* p) {
    using T = typename std::remove_const<typename std::remove_pointer<decltype(p)>::type>::type;
    int64_t i = b;
    const bool lanes = QCOMM_SIMD_LEVEL >= 2 || std::is_same<T, fp16_t>::value;
    for (; lanes && i + simd::kLanes <= e; i += simd::kLanes) {
      const vf v = simd::widen(p + i);
      simd::storef(out + i, accumulate ? simd::loadf(out + i) + v : v);
    }
    for (; i < e; ++i) out[i] = accumulate ? out[i] + toFloat(p[i]) : toFloat(p[i]);
  });
}

// out[group] = H float(x[group]) for groups g0..g1 of `groupSize`; out may be x (fp32).
void rotateRange(const void* x, int32_t dtype, int groupSize, int64_t g0, int64_t g1, float* out) {
  withElements(x, dtype, [&](auto* p) {
    float buf[kMaxGroupSize];
    for (int64_t g = g0; g < g1; ++g) {
      rotateGroupInto(p + g * groupSize, groupSize, buf);
      float* o = out + g * groupSize;
      for (int i = 0; i < groupSize; ++i) o[i] = buf[i];
    }
  });
}

}  // namespace QCOMM_SIMD_NS
}  // namespace qcomm
