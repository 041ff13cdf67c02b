// The SIMT emulator's hook for the kernels' L2 prefetches: tile_codec.cuh prefetchL2 does nothing
// under the emulator but call prefetchHook when a driver has set it (from any fiber,
// concurrently). The drivers (codec_main.cpp, ipc_main.cpp), which are not compiled with simt.h,
// set it to checkPrefetch to check that every address a kernel prefetches lies in what it reads.
// prefetchHook is defined in simt.cpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

namespace qcomm {
namespace simt {

extern void (*prefetchHook)(const void* p);

// The [begin, end) byte ranges the kernels of the next launch may prefetch from (set before the
// launch; only read while it runs), and the counts: addresses prefetched, and those outside
// every range.
inline std::vector<std::pair<const uint8_t*, const uint8_t*>> prefetchRanges;
inline std::atomic<int64_t> prefetches{0}, strayPrefetches{0};

inline void checkPrefetch(const void* p) {
  const auto* b = static_cast<const uint8_t*>(p);
  ++prefetches;
  for (const auto& r : prefetchRanges) {
    if (b >= r.first && b < r.second) return;
  }
  ++strayPrefetches;
}

}  // namespace simt
}  // namespace qcomm
