// QncclBackend's quantized allreduce of CUDA tensors: transport choice, streams and Work, as
// ProcessGroupNCCL does them. Built only with CUDA.
//
// Streams: the input is taken as ready on the caller's current stream. An async op (asyncOp)
// runs on the group's side stream after an event recorded on the current stream; its Work's
// wait() makes the then-current stream wait for the end event, without blocking the host.
// asyncOp=false (torch 2.8+) runs on the current stream itself with the NCCL transport; with the
// IPC transport every call runs on the side stream (calls share the group's buffers and device
// epoch, so they must not overlap, whatever stream each caller is on) and a sync call makes the
// current stream wait for it at once. Nothing here synchronizes with the device, so the op can
// be captured in a CUDA graph once the group's transport is set up (the first quantized CUDA
// allreduce does that).
#ifdef QCOMM_WITH_CUDA

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdlib>

#include "algo/collective.h"
#include "backend/backend.h"
#include "backend/work.h"
#include "codec/codec_ops.h"
#include "transport/cuda_ipc.h"

namespace qcomm {

struct CudaPath {
  int device = -1;
  std::shared_ptr<IpcTransport> ipc;  // null: the NCCL transport (shared with the Works)
  std::string note;                   // why IPC was not chosen
  c10::cuda::CUDAStream side;
  explicit CudaPath(c10::cuda::CUDAStream s) : side(s) {}
};

void CudaPathDeleter::operator()(CudaPath* p) const { delete p; }

namespace {

// QCOMM_TRANSPORT: auto (IPC when every rank can map every peer's buffer, else NCCL), ipc, nccl.
std::string transportMode(const std::string& prefix) {
  const char* v = std::getenv("QCOMM_TRANSPORT");
  const std::string mode = v && *v ? v : "auto";
  TORCH_CHECK_VALUE(mode == "auto" || mode == "ipc" || mode == "nccl", prefix,
                    "invalid QCOMM_TRANSPORT '", mode, "'; allowed: auto, ipc, nccl");
  return mode;
}

// The integer setting `name`, or `unset` when it is not set or empty; a ValueError naming the
// setting and what is `allowed` when it is not a whole integer or `ok` refuses it.
template <class Ok>
long long intSetting(const char* name, long long unset, const std::string& prefix, Ok ok,
                     const std::string& allowed) {
  const char* v = std::getenv(name);
  if (!v || !*v) return unset;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  TORCH_CHECK_VALUE(end && *end == '\0' && ok(n), prefix, "invalid ", name, " '", v,
                    "'; allowed: ", allowed);
  return n;
}

// QCOMM_IPC_BUFFER_MB: each rank's CUDA-IPC buffer, in MiB (default 32).
int64_t ipcBufferBytes(const std::string& prefix) {
  const long long mb = intSetting(
      "QCOMM_IPC_BUFFER_MB", 32, prefix, [](long long n) { return n >= 1 && n <= 65536; },
      "an integer from 1 to 65536");
  return int64_t(mb) << 20;
}

// QCOMM_IPC_TILE_ELEMS: elements per tile of the fused two_step (default 4096).
int64_t ipcTileElems(const std::string& prefix) {
  return intSetting(
      "QCOMM_IPC_TILE_ELEMS", kIpcTileElems, prefix,
      [](long long n) {
        return n >= kIpcMinTileElems && n <= kIpcMaxTileElems && (n & (n - 1)) == 0;
      },
      "a power of two from " + std::to_string(kIpcMinTileElems) + " to " +
          std::to_string(kIpcMaxTileElems));
}

// QCOMM_IPC_TASK_WARPS: warps per task group of the fused kernel (1, 2, 4 or 8; default 8, the
// whole block). A local launch shape: ranks may differ, the results do not depend on it.
int ipcTaskWarps(const std::string& prefix) {
  return int(intSetting(
      "QCOMM_IPC_TASK_WARPS", kIpcBlockWarps, prefix,
      [](long long n) { return n == 1 || n == 2 || n == 4 || n == 8; }, "1, 2, 4 or 8"));
}

// QCOMM_IPC_KERNELS: how the CUDA-IPC transport runs two_step: separate (default; the NCCL
// transport's codec kernels, with the bytes copied through the buffers: ipc_exchange.h) or fused
// (one persistent kernel, ipc_two_step.cu). The same on every rank (the set-up checks). Separate
// is the default since the H200 timed both side by side (2026-11-30, eighth session: 1.6-2.7x
// faster from 16 to 256 MiB; benchmarks/RESULTS.md), and its kernels need no co-residency: the
// fused kernel's blocks all spin on peers at once, so work holding SMs delays every rank.
bool ipcSeparateKernels(const std::string& prefix) {
  const char* v = std::getenv("QCOMM_IPC_KERNELS");
  const std::string k = v && *v ? v : "separate";
  TORCH_CHECK_VALUE(k == "fused" || k == "separate", prefix, "invalid QCOMM_IPC_KERNELS '", k,
                    "'; allowed: fused, separate");
  return k == "separate";
}

// The NCCL transport: the algorithms over the inner backend's collectives (collective_algos.cpp)
// with the CUDA codec kernels on `stream`. Returns the encoded bytes this rank sends (the unpadded
// count: the all-to-all and all-gather pad units to one size).
int64_t runCollectiveCuda(const Plan& plan, c10d::Backend& inner, int rank, at::Tensor& data,
                          const c10::cuda::CUDAStream& stream, std::chrono::milliseconds timeout) {
  std::unique_ptr<CodecOps> ops = makeCudaCodecOps(stream.stream(), stream.device_index());
  runCollective(plan, inner, rank, data, *ops, timeout);
  int64_t wire = 0;
  for (int c = 0; c < plan.world; ++c) {
    const ChunkRange ch = plan.chunk(c);
    wire += c == rank ? (plan.world - 1) * encodedBytes(ch.len, plan.ag)
                      : encodedBytes(ch.len, plan.rs);
  }
  return wire;
}

bool isCapturing(const c10::cuda::CUDAStream& s) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(s.stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace

std::string QncclBackend::cudaTransport() const {
  std::lock_guard<std::mutex> lock(cudaMutex_);
  if (!cuda_) return "";
  return cuda_->ipc ? "ipc" : "nccl";
}

std::string QncclBackend::cudaTransportNote() const {
  std::lock_guard<std::mutex> lock(cudaMutex_);
  return cuda_ ? cuda_->note : "";
}

std::string QncclBackend::cudaIpcKernels() const {
  std::lock_guard<std::mutex> lock(cudaMutex_);
  if (!cuda_ || !cuda_->ipc) return "";
  return cuda_->ipc->separate() ? "separate" : "fused";
}

std::vector<std::pair<std::string, int64_t>> QncclBackend::cudaIpcProfile() const {
  std::lock_guard<std::mutex> lock(cudaMutex_);
  std::vector<std::pair<std::string, int64_t>> out;
  if (!cuda_ || !cuda_->ipc) return out;
  const std::vector<int64_t> v = cuda_->ipc->profile();
  for (size_t i = 0; i < v.size(); ++i) {
    out.emplace_back(i < size_t(kIpcPhases) ? kIpcPhaseNames[i] : "runs", v[i]);
  }
  return out;
}

CudaPath& QncclBackend::cudaPath(int device, bool capturing) {
  std::lock_guard<std::mutex> lock(cudaMutex_);
  if (cuda_) {
    TORCH_CHECK_VALUE(
        cuda_->device == device, prefix(),
        "allreduce: this group's quantized CUDA allreduces run on cuda:", cuda_->device,
        ", got a tensor on cuda:", device, "; use one device per rank and group, as with NCCL");
    return *cuda_;
  }
  // the set-up runs once: a failure (a store time-out, QCOMM_TRANSPORT=ipc refused) stays, so
  // that no rank ever repeats the store rounds alone
  TORCH_CHECK(cudaSetupError_.empty(), cudaSetupError_);
  TORCH_CHECK(!capturing, prefix(),
              "allreduce: the first quantized CUDA allreduce of a group sets up its transport "
              "(buffers, handles) and cannot run under CUDA graph capture; run one allreduce on "
              "the group before capturing (a warm-up, as torch.cuda.graph recommends)");
  try {
    // invalid settings still take part in the set-up (as mode "invalid"), so that every rank
    // raises instead of the others waiting for this one in the store
    std::string mode = "invalid", settingsError;
    int64_t bufferBytes = 0, tileElems = kIpcTileElems;
    int taskWarps = kIpcBlockWarps;
    bool separate = false;
    try {
      mode = transportMode(prefix());
      bufferBytes = ipcBufferBytes(prefix());
      tileElems = ipcTileElems(prefix());
      taskWarps = ipcTaskWarps(prefix());
      separate = ipcSeparateKernels(prefix());
    } catch (const c10::Error& e) {
      mode = "invalid";
      settingsError = e.what_without_backtrace();
    }
    std::unique_ptr<CudaPath, CudaPathDeleter> p(
        new CudaPath(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device)));
    p->device = device;
    std::string mustFail;
    if (!store_) {
      p->note = "no store was given to the backend";
      if (mode == "ipc") mustFail = "QCOMM_TRANSPORT=ipc but " + p->note;
    } else {
      // every rank takes part, whatever its mode, so that the verdict is the same everywhere
      p->ipc = IpcTransport::create(*store_, getRank(), getSize(), device, bufferBytes, tileElems,
                                    separate, mode, &p->note, &mustFail);
      if (p->ipc) p->ipc->setTaskWarps(taskWarps);
    }
    TORCH_CHECK_VALUE(settingsError.empty(), settingsError);
    TORCH_CHECK(mustFail.empty(), prefix(), "allreduce: ", mustFail);
    cuda_ = std::move(p);
  } catch (const c10::Error& e) {
    cudaSetupError_ = e.what_without_backtrace();
    throw;
  } catch (const std::exception& e) {
    cudaSetupError_ = e.what();
    throw;
  }
  return *cuda_;
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allreduceCuda(Plan plan,
                                                           std::vector<at::Tensor>& tensors,
                                                           const c10d::AllreduceOptions& opts) {
  at::Tensor& t = tensors[0];
  TORCH_CHECK_VALUE(!plan.rotate, prefix(),
                    "allreduce: rotate=True is not supported for CUDA tensors yet (CPU only); "
                    "set rotate=False for this group");
  const int device = t.device().index();
  c10::cuda::CUDAGuard guard(t.device());
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device);
  CudaPath& path = cudaPath(device, isCapturing(current));
  const std::string pre = prefix();
  std::shared_ptr<IpcTransport> ipc = path.ipc;
  std::function<void()> check = [ipc, pre]() {
    if (ipc) ipc->checkError(pre);
  };
  const auto timeout = callTimeout(opts);
  plan.callSeq = callSeq_++;
  // A non-contiguous input is copied now, on the caller's stream (where it is ready), before the
  // agreement: after it a peer may already wait in this call's first barrier for this rank, and
  // with ranks as threads of one process the copy kernel's first launch (lazy loading) or an
  // allocation that synchronises the device would wait for that peer.
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  Transport control(gloo_.get(), getRank(), getSize(), timeout);
  agreeOnPlan(plan, control);  // host-side, over Gloo: nothing waits for the device
  // an earlier call's kernel gave up: say so before enqueuing more. After the agreement, so that
  // a peer whose kernels ended cleanly is not left waiting in it: it enqueues, and its kernel
  // stops at once on the abort word the failed rank set in every buffer.
  check();
  const bool useIpc = ipc && plan.algorithm == kTwoStep;
  TORCH_CHECK(useIpc || nccl_, prefix(), "allreduce: no NCCL backend for the ",
              algoName(plan.algorithm), " algorithm (CUDA IPC runs two_step only)");

  // Async ops run on the side stream. So do all IPC calls: they share the group's buffers and
  // device epoch, so one must end before the next starts, whatever stream the caller is on; a
  // sync call then makes the current stream wait at once.
  const bool onSide = opts.asyncOp || useIpc;
  const c10::cuda::CUDAStream run = onSide ? path.side : current;
  if (onSide) {
    at::cuda::CUDAEvent ready;
    ready.record(current);
    ready.block(run);
  }
  int64_t wire = 0;
  {
    c10::cuda::CUDAStreamGuard onRun(run);
    if (onSide) {
      // the caller's tensor is used on the side stream: keep its memory from being reused before
      // (recorded before the launch, so that a launch failing part-way is covered too)
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), run);
      if (!buf.is_same(t))
        c10::cuda::CUDACachingAllocator::recordStream(buf.storage().data_ptr(), run);
    }
    if (useIpc) {
      wire = ipc->run(plan, buf, run.stream(), timeout);
    } else {
      wire = runCollectiveCuda(plan, *nccl_, getRank(), buf, run, timeout);
    }
    if (!buf.is_same(t)) t.copy_(buf);
  }
  auto done = std::make_shared<at::cuda::CUDAEvent>();
  done->record(run);
  if (onSide && !opts.asyncOp) done->block(current);
  stats_.quantizedCalls++;
  stats_.inputBytes += t.numel() * t.element_size();
  stats_.wireBytes += wire;
  return c10::make_intrusive<CudaWork>(getRank(), tensors, std::move(done), run, std::move(check));
}

}  // namespace qcomm

#endif  // QCOMM_WITH_CUDA
