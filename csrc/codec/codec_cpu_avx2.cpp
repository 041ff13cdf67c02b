// The CPU codec's group loops compiled for AVX2 with FMA and F16C (codec_cpu_loops.h). Nothing in
// this unit runs unless codec_cpu.cpp has found those instructions on the CPU: the table below is
// constant data, and every function is compiled for them.
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "codec/codec.h"
#include "codec/codec_cpu_isa.h"

#pragma GCC target("avx2,fma,bmi2,f16c")
#define QCOMM_SIMD_LEVEL 2
#define QCOMM_SIMD_NS avx2
#include "codec/codec_cpu_loops.h"

namespace qcomm {
const GroupLoops kAvx2Loops = {"avx2",
                               avx2::encodeRange,
                               avx2::decodeRange,
                               avx2::decodeStreamedRange,
                               avx2::decodeSumRange,
                               avx2::encodeRotatedRange,
                               avx2::decodeRotatedRange,
                               avx2::widenRange,
                               avx2::rotateRange};
}  // namespace qcomm
#endif
