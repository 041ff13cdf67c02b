// The CUDA-IPC intra-node transport (host side): one buffer per rank, allocated once, its handle
// exchanged through the group's store, every peer's mapped; each call's exchanges run as copy and
// barrier kernels through the buffers (ipc_exchange.h, the separate kernels). Built only with CUDA.
#pragma once

#ifdef QCOMM_WITH_CUDA

#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "cuda/ipc_layout.h"
#include "transport/transport.h"

namespace qcomm {

class IpcTransport {
 public:
  // What a rank brings to the set-up; ranks whose buffers or kernels differ do not use IPC.
  struct Settings {
    std::string mode = "auto";  // QCOMM_TRANSPORT (auto, ipc, nccl), or "invalid"
    int64_t bufferBytes = 0;    // QCOMM_IPC_BUFFER_MB, in bytes
    bool separate = true;       // QCOMM_IPC_KERNELS=separate (false: the fused experiment)
    int64_t tileElems = 0;      // the fused experiment's QCOMM_IPC_TILE_ELEMS (0 without it)
    int profileSlots = 0;       // the fused experiment's QCOMM_IPC_PROFILE counters (0: none)
    cudaError_t (*preload)() = nullptr;  // loads the fused experiment's kernels (see ipcPreload)
    int blocks = 0;             // QCOMM_IPC_BLOCKS: most blocks of a launch (0: the default)
    int64_t spinTimeoutMs = 0;  // QCOMM_IPC_SPIN_TIMEOUT_MS (0: the group's timeout)
  };

  // Collective over the store (every rank of the group calls it once, at its first quantized
  // CUDA allreduce, whatever its mode): decides whether every rank can map every peer's buffer
  // (same host; each peer's GPU is this rank's GPU or reachable with peer access; every rank's
  // mode allows IPC and its buffer size and kernels are the same) and, if so, maps them. Returns
  // null with `whyNot` set when IPC is not possible; the verdict is the same on every rank. So is
  // *mustFail, set when every rank must raise instead of falling back to NCCL: some rank's mode is
  // "ipc" and IPC is not possible, or some rank's settings are invalid (mode "invalid").
  static std::unique_ptr<IpcTransport> create(c10d::Store& store, int rank, int world, int device,
                                              const Settings& settings, std::string* whyNot,
                                              std::string* mustFail);
  ~IpcTransport();
  IpcTransport(const IpcTransport&) = delete;
  IpcTransport& operator=(const IpcTransport&) = delete;

  // The exchanges of one call (all-to-all, all-gather and point-to-point legs) as copy and barrier
  // kernels on `stream` through the buffers; the caller has called checkError() first and made
  // `stream` current. It allocates nothing once its first exchange has begun. The call's first
  // barrier compares `fingerprint` (planFingerprint) across the ranks: ranks whose calls differ
  // give up there (an error on every rank, code 3), before any byte is copied.
  std::unique_ptr<Transport> exchanges(cudaStream_t stream, std::chrono::milliseconds timeout,
                                       uint32_t fingerprint);
  // Enqueued after a call's kernels: if this rank's kernels gave up (its abort word), every byte of
  // `data` becomes 0xFF (NaN), so a failed call leaves no plausible numbers behind.
  void poisonIfAborted(uint8_t* data, int64_t bytes, cudaStream_t stream) const;
  // The call's launches are enqueued on `stream` (eager: outside CUDA graph capture), or failed
  // part-way with `cause` (non-empty): teardown will wait for what was enqueued; a failure stops
  // every rank's kernels and raises, and after an eager one the group cannot continue.
  void ended(cudaStream_t stream, bool eager, const std::string& cause);
  // This rank's call failed before enqueuing anything (an allocation, a device check) while its
  // peers' calls may already wait for it in their first barrier: stop every rank's kernels now
  // (the abort words, ipcSetAbortWords), as a launch failing part-way does, rather than let them
  // spin to the group's timeout; every later call on this rank raises ipcAbandonedError(cause).
  // The group cannot continue. The host emulation takes the same path (ipcAbandonEmulate; CPU
  // test in tests/transport/test_ipc_exchange.py).
  void abandon(const std::string& cause);
  // Throws, naming rank, step, peer and tile, if a kernel of this transport gave up, or if a
  // launch failed part-way (the barrier counts can no longer agree). Reads host-mapped memory:
  // never synchronizes.
  void checkError(const std::string& prefix) const;

  int64_t bufferBytes() const { return bufferBytes_; }
  bool separate() const { return settings_.separate; }
  const Settings& settings() const { return settings_; }
  // What the kernels' waits need for a call bounded by `timeout` (QCOMM_IPC_SPIN_TIMEOUT_MS may
  // lower it).
  IpcPeers peers(std::chrono::milliseconds timeout) const;
  int smCount() const { return smCount_; }
  // The fused experiment's QCOMM_IPC_PROFILE counters on the device (null without them), and
  // their values, read without a sync.
  unsigned long long* deviceProfile() const { return deviceProfile_; }
  std::vector<int64_t> profile() const;

 private:
  IpcTransport() = default;
  // True when `event` completed (or can no longer be waited for) within `bound`.
  static bool waitEvent(cudaEvent_t event, std::chrono::seconds bound);
  // Set every rank's abort word (its kernels stop spinning and record that a peer gave up).
  void abortPeers();
  int rank_ = 0, world_ = 0, device_ = 0, smCount_ = 0;
  int64_t bufferBytes_ = 0;
  Settings settings_;
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
