// The CPU codec's group loops for the x86-64 baseline (SSE2), or for any other CPU as plain C++:
// the fallback every machine can run (codec_cpu_loops.h).
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "codec/codec.h"
#include "codec/codec_cpu_isa.h"

#define QCOMM_SIMD_LEVEL 0
#define QCOMM_SIMD_NS generic
#include "codec/codec_cpu_loops.h"

namespace qcomm {
const GroupLoops kGenericLoops = {"generic",
                                  generic::encodeRange,
                                  generic::decodeRange,
                                  generic::decodeStreamedRange,
                                  generic::decodeSumRange,
                                  generic::encodeRotatedRange,
                                  generic::decodeRotatedRange,
                                  generic::widenRange,
                                  generic::rotateRange};
}  // namespace qcomm
