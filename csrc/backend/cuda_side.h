// CudaSide: the CUDA side of a group (call_cuda.cpp): the device, the transport chosen at the
// first quantized CUDA call (CUDA IPC or the inner NCCL backend) and the side stream of async
// ops, set up once, collectively, through the store.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backend/group.h"

namespace qcomm {

struct CudaPath;  // call_cuda.cpp
struct CudaPathDeleter {
  void operator()(CudaPath* p) const;
};

// What qcomm reports of a group's CUDA side.
struct CudaInfo {
  std::string transport;  // "ipc" or "nccl"; "" before the first quantized CUDA call
  std::string note;       // why CUDA IPC was not chosen (empty when it was)
  std::string kernels;    // with IPC: "fused" or "separate" (QCOMM_IPC_KERNELS); "" otherwise
  // QCOMM_IPC_PROFILE=1 at the set-up: (phase, cycles summed over the fused kernel's blocks)
  // since then, and ("runs", block-pieces run); empty otherwise
  std::vector<std::pair<std::string, int64_t>> profile;
};

class CudaSide {
 public:
  explicit CudaSide(Group& group) : g_(group) {}
  CudaInfo info() const;
  // The path of this group, set up on first use (`capturing`: under CUDA graph capture, where
  // the set-up cannot run).
  CudaPath& path(int device, bool capturing);
  // A CUDA call failed before its launches were shared with the peers: the group's IPC
  // transport (if set up) is abandoned with the error, so that peers waiting on this rank stop.
  void abandon(const std::exception& e);

 private:
  Group& g_;
  mutable std::mutex mutex_;
  std::unique_ptr<CudaPath, CudaPathDeleter> path_;
  std::string setupError_;  // the set-up failed: every later CUDA call raises this
};

}  // namespace qcomm
