// The CUDA-IPC transport's host side (see cuda_ipc.h).
#ifdef QCOMM_WITH_CUDA

#include "transport/cuda_ipc.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "algo/algorithms.h"
#include "algo/collective.h"
#include "codec/codec_ops.h"
#include "cuda/codec_kernels.h"
#include "transport/ipc_exchange.h"

namespace qcomm {
namespace {

// The settings whose invalid value makes a rank's mode "invalid" (backend_cuda.cpp).
constexpr const char* kSettings =
    "QCOMM_TRANSPORT, QCOMM_IPC_BUFFER_MB, QCOMM_IPC_TILE_ELEMS, QCOMM_IPC_TASK_WARPS or "
    "QCOMM_IPC_KERNELS";

// What each rank publishes under qcomm_ipc/info/<rank>.
struct PeerInfo {
  char host[64];
  char busId[32];
  char mode[8];         // its QCOMM_TRANSPORT
  int64_t bufferBytes;  // its QCOMM_IPC_BUFFER_MB, in bytes: the tiling depends on it
  int64_t tileElems;    // its QCOMM_IPC_TILE_ELEMS: so does this
  uint64_t process;     // a random token of its process: ranks that are threads of one process
  int32_t allocated;
  int32_t separate;  // its QCOMM_IPC_KERNELS is separate: every rank must run the same kernels
  uint64_t pointer;  // the buffer's address in its owner's process (used within one process)
  cudaIpcMemHandle_t handle;
};

// A token per process, so that "the same process" never rests on a pid (containers that share a
// host name can reuse pids).
uint64_t processToken() {
  static const uint64_t token = [] {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ uint64_t(rd()) ^ uint64_t(getpid());
  }();
  return token;
}

std::vector<uint8_t> bytesOf(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

// A verdict as a store value: "ok", or "no:" and the reason (never empty, whatever the store).
std::vector<uint8_t> verdict(const std::string& why) {
  const std::string v = why.empty() ? "ok" : "no:" + why;
  return std::vector<uint8_t>(v.begin(), v.end());
}

// The reason in a verdict read back, "" for "ok".
std::string reasonOf(const std::vector<uint8_t>& v) {
  const std::string s(v.begin(), v.end());
  return s == "ok" ? "" : s.substr(s.rfind("no:", 0) == 0 ? 3 : 0);
}

std::string cudaWhy(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

// store.get, with a failure (a rank that never publishes: the store's timeout) said in our words.
std::vector<uint8_t> getFrom(c10d::Store& store, const std::string& key, int rank, int world,
                             int from) {
  try {
    return store.get(key);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, rankPrefix(rank, world), "CUDA-IPC set-up: waiting for rank ", from,
                "'s record '", key,
                "' in the store failed; every rank must make its first quantized CUDA allreduce "
                "on this group (and hold the same QCOMM_CUDA_QUANTIZE): ",
                e.what());
  }
}

}  // namespace

std::unique_ptr<IpcTransport> IpcTransport::create(c10d::Store& store, int rank, int world,
                                                   int device, int64_t bufferBytes,
                                                   int64_t tileElems, bool separate,
                                                   const std::string& mode, std::string* whyNot,
                                                   std::string* mustFail) {
  c10::cuda::CUDAGuard guard(device);  // every allocation and mapping below is on `device`
  if (world > kIpcMaxRanks) {
    // known on every rank without asking: no store rounds (they cost world^2 reads)
    const std::string why = "more than " + std::to_string(kIpcMaxRanks) + " ranks";
    if (mustFail && (mode == "ipc" || mode == "invalid")) {
      *mustFail = mode == "ipc" ? "QCOMM_TRANSPORT=ipc but CUDA IPC is not possible: " + why
                                : std::string(kSettings) + " is invalid";
    }
    if (whyNot) *whyNot = why;
    return nullptr;
  }
  std::unique_ptr<IpcTransport> t(new IpcTransport());
  t->rank_ = rank;
  t->world_ = world;
  t->device_ = device;
  t->bufferBytes_ = bufferBytes;
  t->tileElems_ = tileElems;
  t->separate_ = separate;
  std::string local;  // why this rank cannot take part ("" = it can)

  PeerInfo mine{};
  gethostname(mine.host, sizeof(mine.host) - 1);
  std::strncpy(mine.mode, mode.c_str(), sizeof(mine.mode) - 1);
  mine.bufferBytes = bufferBytes;
  mine.tileElems = tileElems;
  mine.separate = separate ? 1 : 0;
  mine.process = processToken();
  cudaDeviceGetPCIBusId(mine.busId, sizeof(mine.busId) - 1, device);
  cudaDeviceGetAttribute(&t->smCount_, cudaDevAttrMultiProcessorCount, device);
  // QCOMM_IPC_BLOCKS caps the blocks of one launch (default: one per SM). Ranks that are threads
  // of one process on one GPU need the cap: their kernels must all be resident at once.
  if (const char* v = std::getenv("QCOMM_IPC_BLOCKS")) {
    const int cap = std::atoi(v);
    if (cap >= 1 && cap < t->smCount_) t->smCount_ = cap;
  }
  if (mode == "nccl") local = "its QCOMM_TRANSPORT is nccl";
  if (mode == "invalid") local = std::string("its ") + kSettings + " is invalid";
  if (local.empty()) {
    // every resource this rank needs, before the first round: a failure is a verdict the peers
    // share, never an exception after they have agreed
    cudaStream_t zeroing = nullptr;
    cudaError_t e = gpu::ipcPreload();
    if (e == cudaSuccess && separate) e = gpu::codecPreload();
    if (e == cudaSuccess) e = cudaMalloc(&t->own_, size_t(bufferBytes));
    // zeroed on a stream of its own: a device-wide sync could wait on a peer's kernel (ranks that
    // are threads of one process)
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMemsetAsync(t->own_, 0, size_t(bufferBytes), zeroing);
    if (e == cudaSuccess) e = cudaStreamSynchronize(zeroing);
    if (zeroing != nullptr) cudaStreamDestroy(zeroing);
    if (e == cudaSuccess) e = cudaIpcGetMemHandle(&mine.handle, t->own_);
    if (e == cudaSuccess) {
      e = cudaHostAlloc(reinterpret_cast<void**>(&t->hostError_), sizeof(IpcError),
                        cudaHostAllocMapped);
    }
    if (e == cudaSuccess) {
      std::memset(t->hostError_, 0, sizeof(IpcError));
      e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&t->deviceError_), t->hostError_, 0);
    }
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&t->lastEnd_, cudaEventDisableTiming);
    const char* profile = std::getenv("QCOMM_IPC_PROFILE");
    if (e == cudaSuccess && profile != nullptr && std::strcmp(profile, "1") == 0) {
      e = cudaHostAlloc(reinterpret_cast<void**>(&t->hostProfile_),
                        sizeof(unsigned long long) * kIpcProfileSlots, cudaHostAllocMapped);
      if (e == cudaSuccess) {
        std::memset(t->hostProfile_, 0, sizeof(unsigned long long) * kIpcProfileSlots);
        e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&t->deviceProfile_), t->hostProfile_,
                                     0);
      }
    }
    if (e != cudaSuccess) {
      local = cudaWhy("setting up its IPC buffer", e);
      cudaGetLastError();
    } else {
      mine.allocated = 1;
      mine.pointer = reinterpret_cast<uint64_t>(t->own_);
    }
  }
  store.set("qcomm_ipc/info/" + std::to_string(rank), bytesOf(&mine, sizeof(mine)));

  std::vector<PeerInfo> all(static_cast<size_t>(world));
  int required = -1, invalid = -1;  // the first rank whose mode is "ipc", "invalid"
  for (int r = 0; r < world; ++r) {
    const std::string key = "qcomm_ipc/info/" + std::to_string(r);
    const std::vector<uint8_t> v = getFrom(store, key, rank, world, r);
    TORCH_CHECK(v.size() == sizeof(PeerInfo), rankPrefix(rank, world), "CUDA-IPC set-up: rank ", r,
                "'s record has ", v.size(), " bytes, not ", sizeof(PeerInfo),
                " (a different qcomm build?)");
    std::memcpy(&all[size_t(r)], v.data(), sizeof(PeerInfo));
    all[size_t(r)].mode[sizeof(mine.mode) - 1] = '\0';
    all[size_t(r)].host[sizeof(mine.host) - 1] = '\0';
    all[size_t(r)].busId[sizeof(mine.busId) - 1] = '\0';
    if (required < 0 && std::strcmp(all[size_t(r)].mode, "ipc") == 0) required = r;
    if (invalid < 0 && std::strcmp(all[size_t(r)].mode, "invalid") == 0) invalid = r;
  }
  for (int r = 0; r < world && local.empty(); ++r) {
    const PeerInfo& p = all[size_t(r)];
    const std::string who = "rank " + std::to_string(r);
    if (std::strcmp(p.mode, "nccl") == 0) {
      local = who + "'s QCOMM_TRANSPORT is nccl";
    } else if (std::strcmp(p.mode, "invalid") == 0) {
      local = who + "'s " + kSettings + " is invalid";
    } else if (p.bufferBytes != bufferBytes) {
      local = "QCOMM_IPC_BUFFER_MB differs: " + std::to_string(bufferBytes >> 20) + " on rank " +
              std::to_string(rank) + ", " + std::to_string(p.bufferBytes >> 20) + " on " + who;
    } else if (p.tileElems != tileElems) {
      local = "QCOMM_IPC_TILE_ELEMS differs: " + std::to_string(tileElems) + " on rank " +
              std::to_string(rank) + ", " + std::to_string(p.tileElems) + " on " + who;
    } else if (p.separate != mine.separate) {
      local = std::string("QCOMM_IPC_KERNELS differs: ") + (separate ? "separate" : "fused") +
              " on rank " + std::to_string(rank) + ", " + (p.separate ? "separate" : "fused") +
              " on " + who;
    } else if (!p.allocated) {
      local = who + " could not set up its buffer";
    } else if (std::strncmp(p.host, mine.host, sizeof(mine.host)) != 0) {
      local = who + " is on another host (" + p.host + ")";
    } else if (r != rank) {
      int peerDevice = -1;
      if (cudaDeviceGetByPCIBusId(&peerDevice, p.busId) != cudaSuccess) {
        cudaGetLastError();
        local = who + "'s GPU " + p.busId + " is not visible to rank " + std::to_string(rank);
      } else if (peerDevice != device) {
        int can = 0;
        cudaDeviceCanAccessPeer(&can, device, peerDevice);
        if (!can) local = "no peer access from GPU " + std::string(mine.busId) + " to " + p.busId;
      }
    }
  }
  // Second round: the verdict must be the same on every rank.
  const std::string verdictKey = "qcomm_ipc/verdict/";
  store.set(verdictKey + std::to_string(rank), verdict(local));
  std::string why;
  for (int r = 0; r < world && why.empty(); ++r) {
    const std::vector<uint8_t> v = getFrom(store, verdictKey + std::to_string(r), rank, world, r);
    const std::string reason = reasonOf(v);
    if (!reason.empty()) why = "rank " + std::to_string(r) + ": " + reason;
  }
  if (why.empty()) {
    for (int r = 0; r < world && why.empty(); ++r) {
      const PeerInfo& p = all[size_t(r)];
      const std::string mapping =
          "rank " + std::to_string(rank) + " mapping rank " + std::to_string(r) + "'s buffer";
      if (r == rank) {
        t->peers_[r] = t->own_;
      } else if (p.process == mine.process) {
        // ranks as threads of one process share the address space; a buffer on another GPU needs
        // peer access enabled (cudaIpcMemLazyEnablePeerAccess covers only opened handles)
        int peerDevice = -1;
        cudaError_t e = cudaDeviceGetByPCIBusId(&peerDevice, p.busId);
        if (e == cudaSuccess && peerDevice != device) {
          e = cudaDeviceEnablePeerAccess(peerDevice, 0);
          if (e == cudaErrorPeerAccessAlreadyEnabled) {
            cudaGetLastError();
            e = cudaSuccess;
          }
        }
        if (e != cudaSuccess) {
          cudaGetLastError();
          why = cudaWhy(mapping.c_str(), e);
        } else {
          t->peers_[r] = reinterpret_cast<uint8_t*>(p.pointer);
        }
      } else {
        void* ptr = nullptr;
        const cudaError_t e = cudaIpcOpenMemHandle(&ptr, p.handle, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
          cudaGetLastError();
          why = cudaWhy(mapping.c_str(), e);
        } else {
          t->peers_[r] = static_cast<uint8_t*>(ptr);
          t->opened_[r] = true;
        }
      }
    }
    // A mapping can fail on one rank only: agree once more.
    store.set(verdictKey + "mapped/" + std::to_string(rank), verdict(why));
    for (int r = 0; r < world && why.empty(); ++r) {
      why = reasonOf(getFrom(store, verdictKey + "mapped/" + std::to_string(r), rank, world, r));
    }
  }
  if (mustFail) {
    if (invalid >= 0) {
      *mustFail =
          "rank " + std::to_string(invalid) + " has an invalid " + kSettings + " (see its error)";
    } else if (required >= 0 && !why.empty()) {
      *mustFail = "QCOMM_TRANSPORT=ipc on rank " + std::to_string(required) +
                  " but CUDA IPC is not possible in this group: " + why;
    }
  }
  if (why.empty()) return t;
  if (whyNot) *whyNot = why;
  return nullptr;
}

IpcTransport::~IpcTransport() {
  // Errors are ignored: at interpreter exit the CUDA context may already be gone. The last
  // launch may still write into peers' buffers: wait for it before unmapping them. A kernel still
  // spinning on a dead peer would hold teardown for its whole bound (the group's timeout): after
  // kTeardownWait, tell every rank's kernel to stop (the abort word) and wait once more; if it
  // still runs, leave the mappings and memory in place rather than pull them from under it.
  constexpr auto kTeardownWait = std::chrono::seconds(10);
  int current = -1;
  const bool restore = cudaGetDevice(&current) == cudaSuccess && current != device_;
  if (restore) cudaSetDevice(device_);
  bool idle = true;
  if (lastEnd_) {
    idle = waitEvent(lastEnd_, kTeardownWait);
    if (!idle) {
      abortPeers();
      idle = waitEvent(lastEnd_, kTeardownWait);
    }
    if (idle) cudaEventDestroy(lastEnd_);
  }
  if (idle) {
    for (int r = 0; r < world_ && r < kIpcMaxRanks; ++r) {
      if (opened_[r]) cudaIpcCloseMemHandle(peers_[r]);
    }
    if (own_) cudaFree(own_);
    if (hostError_) cudaFreeHost(hostError_);
    if (hostProfile_) cudaFreeHost(hostProfile_);
  } else {
    std::fprintf(stderr,
                 "%s[qcomm] CUDA-IPC teardown: this rank's last two_step is still running after "
                 "%lld s; its buffers are left mapped (a peer may have died)\n",
                 rankPrefix(rank_, world_).c_str(), (long long)(2 * kTeardownWait.count()));
  }
  if (restore) cudaSetDevice(current);
  cudaGetLastError();
}

bool IpcTransport::waitEvent(cudaEvent_t event, std::chrono::seconds bound) {
  const auto end = std::chrono::steady_clock::now() + bound;
  for (;;) {
    const cudaError_t e = cudaEventQuery(event);
    if (e != cudaErrorNotReady) return true;  // done, or the context is gone: nothing runs
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void IpcTransport::abortPeers() {
  // any nonzero abort word stops a kernel's spins (memset writes 0x01010101). On a non-blocking
  // stream of its own: any other stream may be queued behind the very kernel this is to stop.
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess) {
    for (int r = 0; r < world_ && r < kIpcMaxRanks; ++r) {
      if (peers_[r] != nullptr) cudaMemsetAsync(peers_[r] + kIpcAbortOffset, 1, 4, s);
    }
    cudaStreamDestroy(s);  // returns at once; the memsets still run
  }
  cudaGetLastError();
}

namespace {

// The separate kernels' exchange (gpu::ExchangeKernels) for the collective path's two_step.
class GpuIpcExchange final : public ByteExchange {
 public:
  GpuIpcExchange(const IpcTwoStepArgs& a, const IpcExchangeGeometry& g, cudaStream_t stream,
                 int maxBlocks)
      : copies_{a, stream, maxBlocks}, x_(copies_, g, copies_.a.buffers, a.rank, a.world) {}
  void allToAll(at::Tensor& out, at::Tensor& in, const char* what, const uint8_t** parts) override {
    const int64_t slot = in.numel() / copies_.a.world;
    x_.run(out.data_ptr<uint8_t>(), in.data_ptr<uint8_t>(), slot, false, parts);
    sent_ += x_.peerBytes(slot);
    check(what);
  }
  void allGather(at::Tensor& out, at::Tensor& in, const char* what,
                 const uint8_t** parts) override {
    x_.run(out.data_ptr<uint8_t>(), in.data_ptr<uint8_t>(), in.numel(), true, parts);
    sent_ += x_.peerBytes(in.numel());
    check(what);
  }
  int64_t sent() const { return sent_; }

 private:
  void check(const char* what) {
    TORCH_CHECK(copies_.error == cudaSuccess, "enqueuing ", what, " failed (",
                cudaGetErrorString(copies_.error), ")");
  }
  gpu::ExchangeKernels copies_;
  ipc::Exchange<gpu::ExchangeKernels> x_;
  int64_t sent_ = 0;
};

}  // namespace

IpcTwoStepArgs IpcTransport::args(const Plan& plan, const IpcGeometry& g, void* data,
                                  std::chrono::milliseconds timeout) const {
  IpcTwoStepArgs a =
      ipcArgs(plan, rank_, g, data, peers_, int64_t(timeout.count()) * 1000000, deviceError_);
  a.smCount = smCount_;
  a.taskWarps = taskWarps_;
  a.profile = deviceProfile_;
  a.releaseFence = gpu::launchFlag("QCOMM_IPC_RELEASE_FENCE", "1") ? 1 : 0;
  a.prefetch = gpu::launchFlag("QCOMM_CUDA_PREFETCH", "1") ? 1 : 0;
  // QCOMM_IPC_SPIN_TIMEOUT_MS lowers the bound of the kernels' spins below the group's timeout
  // (tests and checks that must fail fast rather than wait the default 30 minutes)
  if (const char* v = std::getenv("QCOMM_IPC_SPIN_TIMEOUT_MS")) {
    const long long ms = std::atoll(v);
    if (ms > 0 && ms * 1000000 < a.timeoutNs) a.timeoutNs = ms * 1000000;
  }
  return a;
}

void IpcTransport::failed(const std::string& cause, bool eager) {
  const std::string msg =
      "allreduce: " + cause +
      (eager ? ". This group's CUDA allreduces cannot continue: destroy it and create a new one."
             : " during CUDA graph capture.");
  if (eager) {
    // some launches may have been enqueued and the epoch or barrier count not advanced: this
    // rank's no longer match its peers'. (A failed capture enqueued nothing: the eager counts
    // still hold.) Stop every rank's kernels now rather than at their time-out.
    abortPeers();
    std::lock_guard<std::mutex> lock(brokenMutex_);
    broken_ = msg;
  }
  TORCH_CHECK(false, rankPrefix(rank_, world_), msg);
}

int64_t IpcTransport::run(const Plan& plan, at::Tensor& data, cudaStream_t stream,
                          std::chrono::milliseconds timeout) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const bool eager = cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
                     capture == cudaStreamCaptureStatusNone;
  if (separate_) return runSeparate(plan, data, stream, timeout, eager);
  std::string why;
  const IpcGeometry g =
      ipcGeometry(plan.chunkElems, plan.rs, plan.ag, world_, bufferBytes_, &why, tileElems_);
  TORCH_CHECK_VALUE(why.empty(), rankPrefix(rank_, world_), "allreduce: ", why);
  const IpcTwoStepArgs a = args(plan, g, data.data_ptr(), timeout);
  const cudaError_t e = gpu::ipcTwoStep(a, stream);
  // eager launches only: teardown waits for the last one (pieces enqueued before a failure too)
  if (eager) cudaEventRecord(lastEnd_, stream);
  if (e != cudaSuccess) {
    failed(std::string("launching the CUDA-IPC two_step failed (") + cudaGetErrorString(e) + ")",
           eager);
  }
  cudaGetLastError();
  // bytes written into peers' buffers: every other chunk's tiles once (reduce), own tiles to
  // every peer (gather, whole 16-byte vectors)
  int64_t wire = 0;
  for (int c = 0; c < world_; ++c) {
    const ChunkRange ch = plan.chunk(c);
    for (int64_t off = 0; off < ch.len; off += g.tileElems) {
      const int64_t len = std::min(g.tileElems, ch.len - off);
      wire += c == rank_ ? (world_ - 1) * alignUp16(encodedBytes(len, plan.ag))
                         : encodedBytes(len, plan.rs);
    }
  }
  return wire;
}

int64_t IpcTransport::runSeparate(const Plan& plan, at::Tensor& data, cudaStream_t stream,
                                  std::chrono::milliseconds timeout, bool eager) {
  std::string why;
  const IpcExchangeGeometry g = ipcExchangeGeometry(world_, bufferBytes_, &why);
  TORCH_CHECK_VALUE(why.empty(), rankPrefix(rank_, world_), "allreduce: ", why);
  const IpcTwoStepArgs a = args(plan, IpcGeometry{}, data.data_ptr(), timeout);
  // an error left pending by earlier, unrelated work must not pass for a failure of these launches
  (void)cudaGetLastError();
  int64_t sent = 0;
  std::string cause;
  try {
    GpuIpcExchange ex(a, g, stream, 2 * smCount_);
    std::unique_ptr<CodecOps> ops = makeCudaCodecOps(stream, c10::DeviceIndex(device_));
    runTwoStepOver(plan, ex, rank_, data, *ops);
    sent = ex.sent();
  } catch (const c10::Error& e) {
    cause = e.what_without_backtrace();
  } catch (const std::exception& e) {
    cause = e.what();
  }
  if (eager) cudaEventRecord(lastEnd_, stream);
  if (!cause.empty()) {
    // the collective path's errors already say "[qcomm rank r/W] allreduce: ": said once, below
    for (const std::string& lead : {rankPrefix(rank_, world_), std::string("allreduce: ")}) {
      if (cause.rfind(lead, 0) == 0) cause = cause.substr(lead.size());
    }
    failed("the CUDA-IPC two_step (separate kernels) failed: " + cause, eager);
  }
  cudaGetLastError();
  return sent;
}

std::vector<int64_t> IpcTransport::profile() const {
  std::vector<int64_t> v;
  if (!hostProfile_) return v;
  const volatile unsigned long long* p = hostProfile_;  // written by the device
  for (int i = 0; i < kIpcProfileSlots; ++i) v.push_back(int64_t(p[i]));
  return v;
}

void IpcTransport::checkError(const std::string& prefix) const {
  {
    std::lock_guard<std::mutex> lock(brokenMutex_);
    TORCH_CHECK(broken_.empty(), prefix, broken_);
  }
  if (!hostError_) return;
  const volatile IpcError* v = hostError_;  // written by the device; read without a sync
  if (v->code == 0) return;
  const IpcError e{v->code, v->step, v->peer, v->tile, v->epoch, v->rank};
  TORCH_CHECK(false, prefix, describeIpcError(e));
}

}  // namespace qcomm

#endif  // QCOMM_WITH_CUDA
