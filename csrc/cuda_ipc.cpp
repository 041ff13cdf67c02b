// The CUDA-IPC transport's host side (see cuda_ipc.h).
#ifdef QCOMM_WITH_CUDA

#include "cuda_ipc.h"

#include <c10/util/Exception.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "algorithms.h"

namespace qcomm {
namespace {

// What each rank publishes under qcomm_ipc/info/<rank>.
struct PeerInfo {
  char host[64];
  char busId[32];
  int32_t pid;
  int32_t allocated;
  uint64_t pointer;  // the buffer's address in its owner's process (used when the pid matches)
  cudaIpcMemHandle_t handle;
};

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

}  // namespace

std::unique_ptr<IpcTransport> IpcTransport::create(c10d::Store& store, int rank, int world,
                                                   int device, int64_t bufferBytes,
                                                   std::string* whyNot) {
  std::unique_ptr<IpcTransport> t(new IpcTransport());
  t->rank_ = rank;
  t->world_ = world;
  t->device_ = device;
  t->bufferBytes_ = bufferBytes;
  std::string local;  // why this rank cannot take part ("" = it can)

  PeerInfo mine{};
  gethostname(mine.host, sizeof(mine.host) - 1);
  mine.pid = int32_t(getpid());
  cudaDeviceGetPCIBusId(mine.busId, sizeof(mine.busId) - 1, device);
  cudaDeviceGetAttribute(&t->smCount_, cudaDevAttrMultiProcessorCount, device);
  // QCOMM_IPC_BLOCKS caps the blocks of one launch (default: one per SM). Ranks that are threads
  // of one process on one GPU need the cap: their kernels must all be resident at once.
  if (const char* v = std::getenv("QCOMM_IPC_BLOCKS")) {
    const int cap = std::atoi(v);
    if (cap >= 1 && cap < t->smCount_) t->smCount_ = cap;
  }
  if (world > kIpcMaxRanks) local = "more than " + std::to_string(kIpcMaxRanks) + " ranks";
  if (local.empty()) {
    cudaError_t e = cudaMalloc(&t->own_, size_t(bufferBytes));
    if (e == cudaSuccess) e = cudaMemset(t->own_, 0, size_t(bufferBytes));
    if (e == cudaSuccess) e = cudaIpcGetMemHandle(&mine.handle, t->own_);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
      local = cudaWhy("allocating the IPC buffer", e);
      cudaGetLastError();
    } else {
      mine.allocated = 1;
      mine.pointer = reinterpret_cast<uint64_t>(t->own_);
    }
  }
  store.set("qcomm_ipc/info/" + std::to_string(rank), bytesOf(&mine, sizeof(mine)));

  std::vector<PeerInfo> all(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const std::vector<uint8_t> v = store.get("qcomm_ipc/info/" + std::to_string(r));
    TORCH_CHECK(v.size() == sizeof(PeerInfo), "[qcomm] IPC: bad peer record from rank ", r);
    std::memcpy(&all[size_t(r)], v.data(), sizeof(PeerInfo));
  }
  for (int r = 0; r < world && local.empty(); ++r) {
    const PeerInfo& p = all[size_t(r)];
    if (!p.allocated) {
      local = "rank " + std::to_string(r) + " could not allocate its buffer";
    } else if (std::strncmp(p.host, mine.host, sizeof(mine.host)) != 0) {
      local = "rank " + std::to_string(r) + " is on another host (" + p.host + ")";
    } else if (r != rank) {
      int peerDevice = -1;
      if (cudaDeviceGetByPCIBusId(&peerDevice, p.busId) != cudaSuccess) {
        cudaGetLastError();
        local = "rank " + std::to_string(r) + "'s GPU " + p.busId + " is not visible to rank " +
                std::to_string(rank);
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
    const std::vector<uint8_t> v = store.get(verdictKey + std::to_string(r));
    const std::string reason = reasonOf(v);
    if (!reason.empty()) why = "rank " + std::to_string(r) + ": " + reason;
  }
  if (why.empty()) {
    for (int r = 0; r < world && why.empty(); ++r) {
      const PeerInfo& p = all[size_t(r)];
      if (r == rank) {
        t->peers_[r] = t->own_;
      } else if (p.pid == mine.pid) {  // ranks as threads of one process share the address space
        t->peers_[r] = reinterpret_cast<uint8_t*>(p.pointer);
      } else {
        void* ptr = nullptr;
        const cudaError_t e = cudaIpcOpenMemHandle(&ptr, p.handle, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
          cudaGetLastError();
          why = cudaWhy(
              ("rank " + std::to_string(rank) + " mapping rank " + std::to_string(r) + "'s buffer")
                  .c_str(),
              e);
        } else {
          t->peers_[r] = static_cast<uint8_t*>(ptr);
          t->opened_[r] = true;
        }
      }
    }
    // A mapping can fail on one rank only: agree once more.
    store.set(verdictKey + "mapped/" + std::to_string(rank), verdict(why));
    for (int r = 0; r < world && why.empty(); ++r) {
      const std::vector<uint8_t> v = store.get(verdictKey + "mapped/" + std::to_string(r));
      why = reasonOf(v);
    }
  }
  if (why.empty()) {
    const cudaError_t e = cudaHostAlloc(reinterpret_cast<void**>(&t->hostError_), sizeof(IpcError),
                                        cudaHostAllocMapped);
    if (e == cudaSuccess) {
      std::memset(t->hostError_, 0, sizeof(IpcError));
      cudaHostGetDevicePointer(reinterpret_cast<void**>(&t->deviceError_), t->hostError_, 0);
    } else {
      // a host allocation failing here is not a decision the peers can share: fail loudly
      TORCH_CHECK(false, "[qcomm] IPC: ", cudaWhy("allocating the error word", e));
    }
    return t;
  }
  if (whyNot) *whyNot = why;
  return nullptr;
}

IpcTransport::~IpcTransport() {
  // Errors are ignored: at interpreter exit the CUDA context may already be gone.
  for (int r = 0; r < world_ && r < kIpcMaxRanks; ++r) {
    if (opened_[r]) cudaIpcCloseMemHandle(peers_[r]);
  }
  if (own_) cudaFree(own_);
  if (hostError_) cudaFreeHost(hostError_);
  cudaGetLastError();
}

int64_t IpcTransport::run(const Plan& plan, at::Tensor& data, cudaStream_t stream,
                          std::chrono::milliseconds timeout) {
  std::string why;
  const IpcGeometry g = ipcGeometry(plan.chunkElems, plan.rs, plan.ag, world_, bufferBytes_, &why);
  TORCH_CHECK_VALUE(why.empty(), rankPrefix(rank_, world_), "allreduce: ", why);
  IpcTwoStepArgs a = ipcArgs(plan, rank_, g, data.data_ptr(), peers_,
                             int64_t(timeout.count()) * 1000000, deviceError_);
  a.smCount = smCount_;
  // QCOMM_IPC_SPIN_TIMEOUT_MS lowers the bound of the kernel's spins below the group's timeout
  // (tests and checks that must fail fast rather than wait the default 30 minutes)
  if (const char* v = std::getenv("QCOMM_IPC_SPIN_TIMEOUT_MS")) {
    const long long ms = std::atoll(v);
    if (ms > 0 && ms * 1000000 < a.timeoutNs) a.timeoutNs = ms * 1000000;
  }
  const cudaError_t e = gpu::ipcTwoStep(a, stream);
  TORCH_CHECK(e == cudaSuccess, rankPrefix(rank_, world_),
              "allreduce: launching the CUDA-IPC two_step: ", cudaGetErrorString(e));
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

void IpcTransport::checkError(const std::string& prefix) const {
  if (!hostError_) return;
  const volatile IpcError* v = hostError_;  // written by the device; read without a sync
  if (v->code == 0) return;
  const IpcError e{v->code, v->step, v->peer, v->tile, v->epoch, v->rank};
  TORCH_CHECK(false, prefix, describeIpcError(e));
}

}  // namespace qcomm

#endif  // QCOMM_WITH_CUDA
