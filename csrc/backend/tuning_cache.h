// The tuning cache file (qcomm/_tuning.py reads it): the table as JSON, and the file replaced
// whole. Rank 0 writes it after each measurement (tuner.cpp, Tuner::save).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/tuning.h"

namespace qcomm {

// "float32", "float16", "bfloat16" for a plan's dtype code.
const char* dtypeText(int32_t d);
// A number as the cache and the log write it (%.6g).
std::string jsonNumber(double v);
// The cache's text: format 2, the key (JSON) and every entry of the table.
std::string tuningCacheJson(const std::string& key, const std::vector<TuneEntry>& entries);
// Writes `out` to `path` whole, through a fresh temporary file renamed over it, so a reader never
// sees half a table; only a regular file (or none) is replaced. Returns why it could not ("" when
// it did).
std::string replaceFile(const std::string& path, const std::string& out);

}  // namespace qcomm
