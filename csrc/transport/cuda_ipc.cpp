// The CUDA-IPC transport's host side (see cuda_ipc.h).
#ifdef QCOMM_WITH_CUDA

#include "transport/cuda_ipc.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "cuda/codec_kernels.h"
#include "cuda/ipc_kernels.h"
#include "transport/ipc_exchange.h"

namespace qcomm {
namespace {

// The settings whose invalid value makes a rank's mode "invalid" (backend/call_cuda.cpp).
constexpr const char* kSettings = "QCOMM_TRANSPORT, QCOMM_IPC_* setting";

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
                                                   int device, const Settings& settings,
                                                   std::string* whyNot, std::string* mustFail) {
  const std::string& mode = settings.mode;
  const int64_t bufferBytes = settings.bufferBytes, tileElems = settings.tileElems;
  const bool separate = settings.separate;
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
  t->settings_ = settings;
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
  // QCOMM_IPC_BLOCKS caps the SMs the kernels size their grids by (default: every SM). Ranks
  // that are threads of one process on one GPU need the cap: their kernels must all be resident
  // at once.
  if (settings.blocks >= 1 && settings.blocks < t->smCount_) t->smCount_ = settings.blocks;
  if (mode == "nccl") local = "its QCOMM_TRANSPORT is nccl";
  if (mode == "invalid") local = std::string("its ") + kSettings + " is invalid";
  if (local.empty()) {
    // every resource this rank needs, before the first round: a failure is a verdict the peers
    // share, never an exception after they have agreed
    cudaStream_t zeroing = nullptr;
    cudaError_t e = gpu::ipcPreload();
    if (e == cudaSuccess && separate) e = gpu::codecPreload();
    if (e == cudaSuccess && settings.preload != nullptr) e = settings.preload();
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
    if (e == cudaSuccess && settings.profileSlots > 0) {
      const size_t bytes = sizeof(unsigned long long) * size_t(settings.profileSlots);
      e = cudaHostAlloc(reinterpret_cast<void**>(&t->hostProfile_), bytes, cudaHostAllocMapped);
      if (e == cudaSuccess) {
        std::memset(t->hostProfile_, 0, bytes);
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
                 "%s[qcomm] CUDA-IPC teardown: this rank's last allreduce is still running after "
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
    ipcSetAbortWords(peers_, world_, [s](uint32_t* word) { cudaMemsetAsync(word, 1, 4, s); });
    cudaStreamDestroy(s);  // returns at once; the memsets still run
  }
  cudaGetLastError();
}

IpcPeers IpcTransport::peers(std::chrono::milliseconds timeout) const {
  IpcPeers p{};
  for (int r = 0; r < world_ && r < kIpcMaxRanks; ++r) p.buffers[r] = peers_[r];
  p.world = world_;
  p.rank = rank_;
  p.timeoutNs = int64_t(timeout.count()) * 1000000;
  // QCOMM_IPC_SPIN_TIMEOUT_MS lowers the bound of the kernels' spins below the group's timeout
  // (tests and checks that must fail fast rather than wait the default 30 minutes)
  const int64_t ms = settings_.spinTimeoutMs;
  if (ms > 0 && ms * 1000000 < p.timeoutNs) p.timeoutNs = ms * 1000000;
  p.hostError = deviceError_;
  return p;
}

std::unique_ptr<Transport> IpcTransport::exchanges(cudaStream_t stream,
                                                   std::chrono::milliseconds timeout,
                                                   uint32_t fingerprint) {
  std::string why;
  const IpcExchangeGeometry g = ipcExchangeGeometry(world_, bufferBytes_, &why);
  TORCH_CHECK_VALUE(why.empty(), rankPrefix(rank_, world_), "allreduce: ", why);
  // an error left pending by earlier, unrelated work must not pass for a failure of these launches
  (void)cudaGetLastError();
  gpu::ExchangeKernels kernels{peers(timeout), stream, 2 * smCount_};
  return std::make_unique<IpcExchangeTransport<gpu::ExchangeKernels>>(kernels, g, peers_, rank_,
                                                                      world_, fingerprint);
}

void IpcTransport::poisonIfAborted(uint8_t* data, int64_t bytes, cudaStream_t stream) const {
  const cudaError_t e =
      gpu::ipcPoisonIfAborted(peers(std::chrono::milliseconds(0)), data, bytes, stream);
  TORCH_CHECK(e == cudaSuccess, rankPrefix(rank_, world_),
              "allreduce: launching the CUDA-IPC call's end check failed: ", cudaGetErrorString(e));
}

void IpcTransport::ended(cudaStream_t stream, bool eager, const std::string& cause) {
  // eager launches only: teardown waits for the last one (pieces enqueued before a failure too)
  if (eager) cudaEventRecord(lastEnd_, stream);
  if (!cause.empty()) {
    const std::string msg =
        "allreduce: " + cause +
        (eager ? ". This group's CUDA allreduces cannot continue: destroy it and create a new one."
               : " during CUDA graph capture.");
    if (eager) {
      // some launches may have been enqueued and the barrier counts not advanced: this rank's no
      // longer match its peers'. (A failed capture enqueued nothing: the eager counts still
      // hold.) Stop every rank's kernels now rather than at their time-out.
      abortPeers();
      std::lock_guard<std::mutex> lock(brokenMutex_);
      broken_ = msg;
    }
    TORCH_CHECK(false, rankPrefix(rank_, world_), msg);
  }
  cudaGetLastError();
}

void IpcTransport::abandon(const std::string& cause) {
  abortPeers();
  std::lock_guard<std::mutex> lock(brokenMutex_);
  if (broken_.empty()) broken_ = ipcAbandonedError(cause);
}

std::vector<int64_t> IpcTransport::profile() const {
  std::vector<int64_t> v;
  if (!hostProfile_) return v;
  const volatile unsigned long long* p = hostProfile_;  // written by the device
  for (int i = 0; i < settings_.profileSlots; ++i) v.push_back(int64_t(p[i]));
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
