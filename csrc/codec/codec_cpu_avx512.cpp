// The CPU codec's group loops compiled for AVX-512 (F, BW, VL, DQ) with FMA and F16C
// (codec_cpu_loops.h). Nothing in this unit runs unless codec_cpu.cpp has found those
// instructions on the CPU: the table below is constant data, and every function is compiled for
// them. The loops' own vectors are 256 bits wide and the compiler is asked to prefer that width
// for what it vectorizes itself: AVX-512's instructions (masks, one-instruction narrowing, 32
// registers) without the 512-bit vectors, whose horizontal steps are longer and which some CPUs
// run at a lower clock.
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "codec/codec.h"
#include "codec/codec_cpu_isa.h"

#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,bmi2,f16c,prefer-vector-width=256")
#define QCOMM_SIMD_LEVEL 3
#define QCOMM_SIMD_NS avx512
#include "codec/codec_cpu_loops.h"

namespace qcomm {
const GroupLoops kAvx512Loops = {"avx512",
                                 avx512::encodeRange,
                                 avx512::decodeRange,
                                 avx512::decodeStreamedRange,
                                 avx512::decodeSumRange,
                                 avx512::encodeRotatedRange,
                                 avx512::decodeRotatedRange,
                                 avx512::widenRange,
                                 avx512::rotateRange};
}  // namespace qcomm
#endif
