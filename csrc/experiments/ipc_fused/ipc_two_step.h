// Launch API of the fused, persistent two_step over CUDA IPC (raw pointers and a stream, no torch
// headers; the QCOMM_EXPERIMENTS=1 build only). One launch per piece (fused_layout.h), then one
// tiny launch that advances the rank's epoch, both on `stream`: nothing is read back to the host,
// so the sequence can be captured in a CUDA graph and replayed (the epoch lives on the device and
// advances per replay).
#pragma once

#include <cuda_runtime.h>

#include "experiments/ipc_fused/fused_layout.h"

namespace qcomm {
namespace gpu {

// Every piece of one rank's call, then its epoch advance; cudaErrorInvalidValue for a task-group
// size that does not divide the block's warps.
cudaError_t ipcTwoStep(const IpcTwoStepArgs& a, cudaStream_t stream);

// Loads the fused kernels on the current device (see gpu::ipcPreload, csrc/cuda/ipc_kernels.h:
// under lazy loading a rank loading a kernel while a peer's kernel spins waiting for it would wait
// for that kernel). Called at the IPC set-up, before any rank can launch.
cudaError_t ipcTwoStepPreload();

}  // namespace gpu
}  // namespace qcomm
