// A host emulation of the fused CUDA-IPC two_step (QCOMM_EXPERIMENTS=1 builds only): the protocol
// of ipc_protocol.h executed by one CPU thread per rank over host memory with the CPU codec, so
// the CPU tests check the kernel's task loop, addressing, tiling, flags and epochs against the
// reference (no GPU needed), and the SIMT driver compares the kernel with it.
#pragma once

#include "experiments/ipc_fused/fused_layout.h"

namespace qcomm {

// Run one rank's whole call (every piece, then the epoch advance) on host buffers, each piece as
// `blocks` threads that split its tasks as the kernel's blocks do (block b takes tasks b, b +
// blocks, ...), joined before the next piece as a kernel launch ends. a.hostError must point to
// host memory shared by the ranks. Returns false when a wait gave up.
bool ipcTwoStepEmulate(const IpcTwoStepArgs& a, int blocks = 1);

}  // namespace qcomm
