// What the backend takes from the fused two_step experiment (QCOMM_EXPERIMENTS=1 builds only,
// under #ifdef QCOMM_EXPERIMENTS in csrc/backend/call_cuda.cpp): the profile's phases
// (fused_layout.h: kIpcPhases, kIpcPhaseNames, kIpcProfileSlots) and, in CUDA builds, the preload
// of its kernels and one call run with them (QCOMM_IPC_KERNELS=fused).
#pragma once

#include "experiments/ipc_fused/fused_layout.h"

#ifdef QCOMM_WITH_CUDA

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>

namespace qcomm {

class IpcTransport;

// Loads the fused kernels on the current device (IpcTransport::Settings::preload).
cudaError_t fusedPreload();

// One quantized two_step call of `plan` with the fused kernel on `stream` through the
// transport's buffers, in place on `data` (contiguous, on the transport's device): its tiling
// (QCOMM_IPC_TILE_ELEMS, agreed at set-up), the peers' waits bounded by `timeout`, task groups of
// QCOMM_IPC_TASK_WARPS warps, the QCOMM_IPC_PROFILE counters; then ipc.ended(stream, eager,
// cause), which raises (and stops every rank's kernels) if something failed. Returns the bytes
// this rank writes into its peers' buffers.
int64_t runFusedTwoStep(IpcTransport& ipc, const Plan& plan, at::Tensor& data, cudaStream_t stream,
                        std::chrono::milliseconds timeout, bool eager);

}  // namespace qcomm

#endif  // QCOMM_WITH_CUDA
