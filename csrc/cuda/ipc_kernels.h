// Launch API of the separate kernels over CUDA IPC (raw pointers and a stream, no torch headers):
// one barrier of this rank among its peers over their buffers (ipc_barrier.h), and up to
// kIpcMaxRanks copies in one launch. The exchange of csrc/transport/ipc_exchange.h schedules them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/ipc_layout.h"

namespace qcomm {
namespace gpu {

// One barrier of rank p.rank among p.world ranks over p.buffers (its waits bounded by
// p.timeoutNs, an error recorded through p.hostError), `index` naming it in an error. With a
// `fingerprint` (a call's first barrier) it also compares the ranks' plan fingerprints, and gives
// up on every rank when they differ (ipc_barrier.h).
cudaError_t ipcBarrier(const IpcPeers& p, uint32_t index, const uint32_t* fingerprint,
                       cudaStream_t stream);

// After a call's kernels: where this rank's abort word is set (a barrier of the call, or of an
// earlier one, gave up), fills the `bytes` of `data` with 0xFF (NaN in every float dtype), so that
// a failed call leaves no plausible numbers; else writes nothing. Grid of 4 blocks.
cudaError_t ipcPoisonIfAborted(const IpcPeers& p, uint8_t* data, int64_t bytes,
                               cudaStream_t stream);

struct IpcCopy {
  uint8_t* dst;
  const uint8_t* src;
  int64_t bytes;
};
struct IpcCopies {
  IpcCopy copy[kIpcMaxRanks];
  int count;
};
// The copies in one launch of at most maxBlocks blocks.
cudaError_t ipcCopy(const IpcCopies& copies, int maxBlocks, cudaStream_t stream);

// The executor of csrc/transport/ipc_exchange.h on the GPU: each step's copies in one copy kernel
// (ipcCopy), and the barrier kernel (ipcBarrier), enqueued on `stream`. A barrier that gives up
// records the error on the device (the transport's checkError reads it); the first launch that
// fails is kept in `error`, and nothing is enqueued after it.
struct ExchangeKernels {
  IpcPeers peers;
  cudaStream_t stream;
  int maxBlocks;  // of a copy kernel
  cudaError_t error = cudaSuccess;
  IpcCopies pending{};
  void copy(uint8_t* dst, const uint8_t* src, int64_t bytes) {
    if (pending.count == kIpcMaxRanks) flush();
    pending.copy[pending.count++] = IpcCopy{dst, src, bytes};
  }
  void flush() {
    if (pending.count > 0 && error == cudaSuccess) error = ipcCopy(pending, maxBlocks, stream);
    pending.count = 0;
  }
  bool barrier(uint32_t index, const uint32_t* fingerprint = nullptr) {
    flush();
    if (error == cudaSuccess) error = ipcBarrier(peers, index, fingerprint, stream);
    return true;
  }
  const char* failure() const { return error == cudaSuccess ? "" : cudaGetErrorString(error); }
};

// Loads this file's kernels on the current device: under lazy loading (CUDA 12.2+'s default) a
// kernel loads at its first launch, and loading waits for the context's running kernels. Ranks
// that are threads of one process share a context, so a rank loading a kernel while a peer's
// barrier kernel waits for this rank would wait for that kernel, and it for this rank. Called at
// the IPC set-up, before any rank can launch.
cudaError_t ipcPreload();

}  // namespace gpu
}  // namespace qcomm
