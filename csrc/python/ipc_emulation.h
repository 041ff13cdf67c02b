// A host emulation of the fused CUDA-IPC two_step: the protocol of csrc/ipc_protocol.h executed by
// one CPU thread per rank over host memory with the CPU codec, so the CPU tests check the kernel's
// task loop, addressing, tiling, flags and epochs against the reference (no GPU needed).
#pragma once

#include <cstring>

#include "cuda/ipc_layout.h"

namespace qcomm {

// Run one rank's whole call (every piece, then the epoch advance) on host buffers, each piece as
// `blocks` threads that split its tasks as the kernel's blocks do (block b takes tasks b, b +
// blocks, ...), joined before the next piece as a kernel launch ends. a.hostError must point to
// host memory shared by the ranks. Returns false when a wait gave up.
bool ipcTwoStepEmulate(const IpcTwoStepArgs& a, int blocks = 1);

// One barrier of the separate kernels (ipc_protocol.h, barrier) on host buffers, by this thread
// as rank a.rank, bounded by a.timeoutNs; false when it gave up (the error is in a.hostError).
bool ipcBarrierEmulate(const IpcTwoStepArgs& a, uint32_t index);

// The host executor of the separate kernels' exchange (ipc_exchange.h): memcpy, and the barrier
// above.
struct HostCopies {
  IpcTwoStepArgs a;  // the barrier's: buffers, rank, world, bound, error record
  void copy(uint8_t* dst, const uint8_t* src, int64_t bytes) {
    std::memcpy(dst, src, size_t(bytes));
  }
  void flush() {}
  bool barrier(uint32_t index) { return ipcBarrierEmulate(a, index); }
};

// How many times, since the process started, a block of the emulation encoded another input tile
// than the protocol had named for prefetching (ipc_protocol.h, nextEncode), or named one it never
// encoded: 0 when the kernel's L2 prefetches (QCOMM_CUDA_PREFETCH=1) fetch what it encodes next.
int64_t ipcEmulatedPrefetchMisses();

}  // namespace qcomm
