// The CUDA-IPC intra-node transport (host side): one buffer per rank, allocated once, its handle
// exchanged through the group's store, every peer's mapped; and the launch of the fused two_step
// (csrc/cuda/ipc_two_step.cu) on a stream. Built only with CUDA.
#pragma once

#ifdef QCOMM_WITH_CUDA

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "cuda/ipc_two_step.h"
#include "plan/plan.h"

namespace qcomm {

class IpcTransport {
 public:
  // Collective over the store (every rank of the group calls it once, at its first quantized
  // CUDA allreduce, whatever its QCOMM_TRANSPORT `mode`): decides whether every rank can map every
  // peer's buffer (same host; each peer's GPU is this rank's GPU or reachable with peer access;
  // every rank's mode allows IPC and its buffer size is the same) and, if so, maps them. Returns
  // null with `whyNot` set when IPC is not possible; the verdict is the same on every rank. So is
  // *mustFail, set when every rank must raise instead of falling back to NCCL: some rank's mode is
  // "ipc" and IPC is not possible, or some rank's settings are invalid (mode "invalid").
  // `separate` (QCOMM_IPC_KERNELS=separate, the same on every rank): calls run the collective
  // path's two_step with its bytes exchanged through the buffers (ipc_exchange.h) instead of the
  // fused kernel.
  static std::unique_ptr<IpcTransport> create(c10d::Store& store, int rank, int world, int device,
                                              int64_t bufferBytes, int64_t tileElems, bool separate,
                                              const std::string& mode, std::string* whyNot,
                                              std::string* mustFail);
  ~IpcTransport();
  IpcTransport(const IpcTransport&) = delete;
  IpcTransport& operator=(const IpcTransport&) = delete;

  // Enqueue the two_step of `plan` on `data` (contiguous, on this rank's device) on `stream`
  // (the fused kernel, or the separate kernels); the caller has called checkError() first and
  // made `stream` current. Returns the bytes this rank writes into peers' buffers.
  int64_t run(const Plan& plan, at::Tensor& data, cudaStream_t stream,
              std::chrono::milliseconds timeout);
  // Throws, naming rank, step, peer and tile, if a kernel of this transport gave up, or if a
  // launch failed part-way (the epochs can no longer agree). Reads host-mapped memory: never
  // synchronizes.
  void checkError(const std::string& prefix) const;
  int64_t bufferBytes() const { return bufferBytes_; }
  bool separate() const { return separate_; }
  // QCOMM_IPC_TASK_WARPS (1, 2, 4 or 8): the fused kernel's warps per task group, from now on.
  void setTaskWarps(int warps) { taskWarps_ = warps; }
  // With QCOMM_IPC_PROFILE=1 at set-up: the kernel's per-phase cycle counters since set-up
  // (kIpcProfileSlots values, see IpcTwoStepArgs::profile), read without a sync (the caller
  // synchronizes first for final values); empty without it.
  std::vector<int64_t> profile() const;

 private:
  IpcTransport() = default;
  // True when `event` completed (or can no longer be waited for) within `bound`.
  static bool waitEvent(cudaEvent_t event, std::chrono::seconds bound);
  // Set every rank's abort word (its kernels stop spinning and record that a peer gave up).
  void abortPeers();
  // The kernels' arguments for a call of `plan` on `data`.
  IpcTwoStepArgs args(const Plan& plan, const IpcGeometry& g, void* data,
                      std::chrono::milliseconds timeout) const;
  int64_t runSeparate(const Plan& plan, at::Tensor& data, cudaStream_t stream,
                      std::chrono::milliseconds timeout, bool eager);
  // A launch failed (cause): eager, this group can no longer run (every later call raises it,
  // every rank's kernels are told to stop); raises.
  void failed(const std::string& cause, bool eager);
  int rank_ = 0, world_ = 0, device_ = 0, smCount_ = 0;
  int64_t bufferBytes_ = 0;
  int64_t tileElems_ = kIpcTileElems;  // QCOMM_IPC_TILE_ELEMS, the same on every rank
  int taskWarps_ = kIpcBlockWarps;     // QCOMM_IPC_TASK_WARPS (local)
  bool separate_ = false;              // QCOMM_IPC_KERNELS=separate, the same on every rank
  uint8_t* own_ = nullptr;
  uint8_t* peers_[kIpcMaxRanks] = {};  // mapped (own_ at rank_)
  bool opened_[kIpcMaxRanks] = {};     // mapped through cudaIpcOpenMemHandle (to close)
  IpcError* hostError_ = nullptr;
  IpcError* deviceError_ = nullptr;
  unsigned long long* hostProfile_ = nullptr;  // QCOMM_IPC_PROFILE: host-mapped counters
  unsigned long long* deviceProfile_ = nullptr;
  cudaEvent_t lastEnd_ = nullptr;   // after the last eager launch: teardown waits for it
  mutable std::mutex brokenMutex_;  // Works may check from other threads
  std::string broken_;              // a launch failed part-way: every later call raises this
};

}  // namespace qcomm

#endif  // QCOMM_WITH_CUDA
