// Launch API of the fused, persistent two_step over CUDA IPC (raw pointers and a stream, no torch
// headers). One launch per piece (csrc/ipc_layout.h), then one tiny launch that advances the
// rank's epoch, both on `stream`: nothing is read back to the host, so the sequence can be
// captured in a CUDA graph and replayed (the epoch lives on the device and advances per replay).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/ipc_layout.h"

namespace qcomm {
namespace gpu {

cudaError_t ipcTwoStep(const IpcTwoStepArgs& a, cudaStream_t stream);

// The separate kernels (QCOMM_IPC_KERNELS=separate, csrc/ipc_exchange.h): one barrier of rank
// a.rank among a.world ranks over a.buffers (ipc_protocol.h, barrier; its waits bounded by
// a.timeoutNs, an error recorded through a.hostError as the fused kernel's are), `index` naming
// it in an error; and up to kIpcMaxRanks copies in one launch of at most maxBlocks blocks.
struct IpcCopy {
  uint8_t* dst;
  const uint8_t* src;
  int64_t bytes;
};
struct IpcCopies {
  IpcCopy copy[kIpcMaxRanks];
  int count;
};
cudaError_t ipcBarrier(const IpcTwoStepArgs& a, uint32_t index, cudaStream_t stream);
cudaError_t ipcCopy(const IpcCopies& copies, int maxBlocks, cudaStream_t stream);

// The separate kernels' executor of csrc/ipc_exchange.h: each step's copies in one copy kernel
// (ipcCopy), and the barrier kernel (ipcBarrier), enqueued on `stream`. A barrier that gives up
// records the error on the device (the transport's checkError reads it); the first launch that
// fails is kept in `error`, and nothing is enqueued after it.
struct ExchangeKernels {
  IpcTwoStepArgs a;  // the barrier's: buffers, rank, world, bound, error record
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
  bool barrier(uint32_t index) {
    flush();
    if (error == cudaSuccess) error = ipcBarrier(a, index, stream);
    return true;
  }
};

// Loads this file's kernels on the current device (see the definition); called once at set-up,
// before any rank can launch.
cudaError_t ipcPreload();

}  // namespace gpu
}  // namespace qcomm
