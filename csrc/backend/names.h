// How the backend's messages and stats keys spell dtypes and size classes (backend.cpp,
// call.cpp): torch's names, and the power-of-two classes of bytes the log and shadow use.
#pragma once

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

namespace qcomm {

// A dtype as Python spells it (torch.float32: "float32").
inline std::string dtypeName(c10::ScalarType t) {
  static const std::pair<c10::ScalarType, const char*> kNames[] = {
      {c10::kFloat, "float32"},     {c10::kDouble, "float64"}, {c10::kHalf, "float16"},
      {c10::kBFloat16, "bfloat16"}, {c10::kLong, "int64"},     {c10::kInt, "int32"},
      {c10::kShort, "int16"},       {c10::kChar, "int8"},      {c10::kByte, "uint8"},
      {c10::kBool, "bool"}};
  for (const auto& kv : kNames) {
    if (kv.first == t) return kv.second;
  }
  return c10::toString(t);
}

// A power of two of bytes, 2^k: "4 KiB".
inline std::string bytesName(int k) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  const int u = std::min(k / 10, 4);
  return std::to_string(int64_t(1) << (k - 10 * u)) + " " + units[u];
}

// "2^k B to 2^(k+1) B" in units, for the size class holding `bytes` (bytes in [2^k, 2^(k+1))).
inline std::string sizeClassName(int64_t bytes) {
  if (bytes == 0) return "0 B";
  int k = 0;
  while (k < 62 && (int64_t(2) << k) <= bytes) ++k;
  return bytesName(k) + " to " + bytesName(k + 1);
}

}  // namespace qcomm
