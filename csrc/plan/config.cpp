// Validation of QuantConfig: the C++ twin of qcomm/config.py's checks.
#include "plan/config.h"

#include <c10/util/Exception.h>

namespace qcomm {

const char* algoName(int32_t algo) {
  switch (algo) {
    case kAuto:
      return "auto";
    case kTwoStep:
      return "two_step";
    case kRing:
      return "ring";
    case kSemiRing:
      return "semi_ring";
    case kAlgoNone:
      return "none";
    default:
      return "?";
  }
}

bool rotates(const QuantConfig& c) {
  return c.rotate < 0 ? c.rsBits == 4 || c.agBits == 4 : c.rotate != 0;
}

void validateConfig(const QuantConfig& c) {
  TORCH_CHECK_VALUE(c.algorithm >= kAuto && c.algorithm <= kAlgoNone,
                    "[qcomm] invalid algorithm code ", c.algorithm,
                    "; allowed: auto, two_step, ring, semi_ring, none");
  TORCH_CHECK_VALUE(c.rsBits == 0 || c.rsBits == 4 || c.rsBits == 8, "[qcomm] invalid rs_bits ",
                    c.rsBits, "; allowed: 4, 8 or none");
  TORCH_CHECK_VALUE(c.agBits == 0 || c.agBits == 4 || c.agBits == 8, "[qcomm] invalid ag_bits ",
                    c.agBits, "; allowed: 4, 8 or none");
  TORCH_CHECK_VALUE(
      c.groupSize >= 32 && c.groupSize <= 1024 && (c.groupSize & (c.groupSize - 1)) == 0,
      "[qcomm] invalid group_size ", c.groupSize, "; allowed: a power of two from 32 to 1024");
  TORCH_CHECK_VALUE(c.minBytes >= 0, "[qcomm] invalid min_bytes ", c.minBytes,
                    "; allowed: an integer >= 0");
  TORCH_CHECK_VALUE(c.microshards >= 1 && c.microshards <= 64, "[qcomm] invalid microshards ",
                    c.microshards, "; allowed: an integer from 1 to 64");
  TORCH_CHECK_VALUE(c.rotate >= -1 && c.rotate <= 1, "[qcomm] invalid rotate code ", c.rotate,
                    "; allowed: 1 (on), 0 (off), -1 (on where a phase has 4 bits)");
  TORCH_CHECK_VALUE(c.shadow >= 0, "[qcomm] invalid shadow ", c.shadow,
                    "; allowed: an integer >= 0 (0: off)");
}

}  // namespace qcomm
