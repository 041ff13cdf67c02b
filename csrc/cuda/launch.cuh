// Kernel launches through one macro, so the kernels' sources also compile as host C++ under the
// SIMT emulator of the CPU tests (tests/native/simt/simt.h defines QCOMM_SIMT and its own
// launcher): QCOMM_LAUNCH(kernel, grid, block, stream)(args...), or QCOMM_LAUNCH_SHARED with the
// bytes of dynamic shared memory per block, which a kernel reaches through dynamicShared().
#pragma once

#include <cstdint>

#if defined(QCOMM_SIMT)
#define QCOMM_LAUNCH(kernel, grid, block, stream) \
  ::qcomm::simt::launcher(kernel, (grid), (block), (stream))
#define QCOMM_LAUNCH_SHARED(kernel, grid, block, bytes, stream) \
  ::qcomm::simt::launcher(kernel, (grid), (block), (stream), (bytes))
#else
#define QCOMM_LAUNCH(kernel, grid, block, stream) kernel<<<(grid), (block), 0, (stream)>>>
#define QCOMM_LAUNCH_SHARED(kernel, grid, block, bytes, stream) \
  kernel<<<(grid), (block), (bytes), (stream)>>>
#endif

namespace qcomm {
namespace gpu {

// The block's dynamic shared memory, 16-byte aligned.
__device__ __forceinline__ uint8_t* dynamicShared() {
#if defined(QCOMM_SIMT)
  return simt::dynamicShared();
#else
  extern __shared__ __align__(16) uint8_t qcommDynamicShared[];
  return qcommDynamicShared;
#endif
}

}  // namespace gpu
}  // namespace qcomm
