// The codec's DType of a torch dtype.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "common/dtype.h"

namespace qcomm {

// kFloat32, kFloat16 or kBFloat16; -1 when the dtype is none of fp32, fp16 and bf16.
inline int32_t dtypeOf(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return kFloat32;
    case at::kHalf:
      return kFloat16;
    case at::kBFloat16:
      return kBFloat16;
    default:
      return -1;
  }
}

}  // namespace qcomm
