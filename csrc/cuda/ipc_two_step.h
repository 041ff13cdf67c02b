// Launch API of the fused, persistent two_step over CUDA IPC (raw pointers and a stream, no torch
// headers). One launch per piece (csrc/ipc_layout.h), then one tiny launch that advances the
// rank's epoch, both on `stream`: nothing is read back to the host, so the sequence can be
// captured in a CUDA graph and replayed (the epoch lives on the device and advances per replay).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../codec.h"
#include "../ipc_layout.h"

namespace qcomm {
namespace gpu {

// What a rank that gives up writes to host-mapped memory (first error wins; code 0 = none).
struct IpcError {
  uint32_t code;   // 1: timed out waiting for a peer; 2: a peer gave up (abort word set)
  uint32_t step;   // 1: reduce phase (waiting for a peer's tile), 2: gather phase
  uint32_t peer;   // the rank waited for
  uint32_t tile;   // the tile index within the chunk
  uint32_t epoch;  // the piece's epoch
  uint32_t rank;   // the rank that gave up
};

struct IpcTwoStepArgs {
  void* data;  // the message, in place (dtype elements, numel of them)
  int32_t dtype;
  int64_t numel;
  int64_t chunkElems;
  CodecSpec rs, ag;
  int world, rank;
  int average;
  Noise rsNoise, agNoise;          // salts of this rank's reduce/gather encodes; base unused
  uint8_t* buffers[kIpcMaxRanks];  // every rank's buffer, mapped in this process (own too)
  IpcGeometry geometry;
  int64_t timeoutNs;    // bound on every spin
  IpcError* hostError;  // host-mapped
  int smCount;
};

cudaError_t ipcTwoStep(const IpcTwoStepArgs& a, cudaStream_t stream);

}  // namespace gpu
}  // namespace qcomm
