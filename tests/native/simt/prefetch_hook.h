// The SIMT emulator's hook for the kernels' L2 prefetches (tile_codec.cuh prefetchL2, which does
// nothing under the emulator but call it when a driver has set it, from any fiber, concurrently):
// the drivers (codec_main.cpp, ipc_main.cpp), which are not compiled with simt.h, check with it
// that every address a kernel prefetches lies in the tensor it reads. Defined in simt.cpp.
#pragma once

namespace qcomm {
namespace simt {
extern void (*prefetchHook)(const void* p);
}  // namespace simt
}  // namespace qcomm
