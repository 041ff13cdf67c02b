// The CPU codec's group loops, one table per instruction set they are compiled for
// (codec_cpu_generic.cpp, codec_cpu_avx2.cpp, codec_cpu_avx512.cpp, each compiling
// codec_cpu_loops.h once); codec_cpu.cpp picks one at run time and threads the calls.
#pragma once

#include <stdint.h>

#include "codec/codec.h"

namespace qcomm {

// Each function takes the groups g0..g1 of a block of n elements (threads split a block by
// groups). The bits are the same whichever table runs them.
struct GroupLoops {
  const char* name;
  // dst = the encoded groups g0..g1 of x (elements of dtype); noise.on: stochastic rounding
  void (*encode)(const void* x, int32_t dtype, int64_t n, const CodecSpec& c, int64_t g0,
                 int64_t g1, uint8_t* dst, const Noise& noise);
  // out[groups] = x^ (or out += x^ with accumulate)
  void (*decode)(const uint8_t* src, int64_t n, const CodecSpec& c, int64_t g0, int64_t g1,
                 float* out, bool accumulate);
  // out[groups] = x^ with non-temporal stores (out 32-byte aligned)
  void (*decodeStreamed)(const uint8_t* src, int64_t n, const CodecSpec& c, int64_t g0, int64_t g1,
                         float* out);
  // out[groups] = x^ of blocks[0] + x^ of blocks[1] + ... (count blocks of n elements), in fp32
  // in that order (out + x^ of blocks[0] + ... with accumulate)
  void (*decodeSum)(const uint8_t* const* blocks, int count, int64_t n, const CodecSpec& c,
                    int64_t g0, int64_t g1, float* out, bool accumulate);
  // encode of H x per group (n a multiple of the group size)
  void (*encodeRotated)(const void* x, int32_t dtype, int64_t n, const CodecSpec& c, int64_t g0,
                        int64_t g1, uint8_t* dst, const Noise& noise);
  // out[groups] = H x^ / g
  void (*decodeRotated)(const uint8_t* src, int64_t n, const CodecSpec& c, int64_t g0, int64_t g1,
                        float* out);
  // out[i] = float(x[i]), or out[i] + float(x[i]) with accumulate, for i in [b, e)
  void (*widen)(const void* x, int32_t dtype, int64_t b, int64_t e, float* out, bool accumulate);
  // out[groups] = H float(x[groups]), groups of groupSize; out may be x (fp32)
  void (*rotate)(const void* x, int32_t dtype, int groupSize, int64_t g0, int64_t g1, float* out);
};

extern const GroupLoops kGenericLoops;
#if defined(__x86_64__) && defined(__GNUC__)
extern const GroupLoops kAvx2Loops;
extern const GroupLoops kAvx512Loops;
#endif

}  // namespace qcomm
