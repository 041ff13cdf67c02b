// Kernel launches through one macro, so the kernels' sources also compile as host C++ under the
// SIMT emulator of the CPU tests (tests/native/simt/simt.h defines QCOMM_SIMT and its own
// launcher): QCOMM_LAUNCH(kernel, grid, block, stream)(args...).
#pragma once

#if defined(QCOMM_SIMT)
#define QCOMM_LAUNCH(kernel, grid, block, stream) \
  ::qcomm::simt::launcher(kernel, (grid), (block), (stream))
#else
#define QCOMM_LAUNCH(kernel, grid, block, stream) kernel<<<(grid), (block), 0, (stream)>>>
#endif
