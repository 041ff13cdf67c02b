// Launch API of the fused, persistent two_step over CUDA IPC (raw pointers and a stream, no torch
// headers). One launch per piece (csrc/ipc_layout.h), then one tiny launch that advances the
// rank's epoch, both on `stream`: nothing is read back to the host, so the sequence can be
// captured in a CUDA graph and replayed (the epoch lives on the device and advances per replay).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../ipc_layout.h"

namespace qcomm {
namespace gpu {

cudaError_t ipcTwoStep(const IpcTwoStepArgs& a, cudaStream_t stream);

// Loads this file's kernels on the current device (see the definition); called once at set-up,
// before any rank can launch.
cudaError_t ipcPreload();

}  // namespace gpu
}  // namespace qcomm
