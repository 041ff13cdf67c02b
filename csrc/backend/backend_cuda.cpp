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

#include "algo/algorithms.h"
#include "backend/backend.h"
#include "backend/staging.h"
#include "backend/work.h"
#include "common/errors.h"
#include "common/settings.h"
#include "cuda/cuda_codec_ops.h"
#include "transport/c10d_transport.h"
#include "transport/cuda_ipc.h"
#ifdef QCOMM_EXPERIMENTS
#include "experiments/ipc_fused/fused.h"
#endif

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

// This rank's CUDA-IPC settings (common/settings.cpp), read at the group's CUDA set-up.
IpcTransport::Settings ipcSettings() {
  IpcTransport::Settings s;
  s.mode = settings::text("QCOMM_TRANSPORT");
  s.bufferBytes = settings::number("QCOMM_IPC_BUFFER_MB") << 20;
  s.separate = settings::text("QCOMM_IPC_KERNELS") == "separate";
  s.blocks = int(settings::number("QCOMM_IPC_BLOCKS"));
  s.spinTimeoutMs = settings::number("QCOMM_IPC_SPIN_TIMEOUT_MS");
#ifdef QCOMM_EXPERIMENTS
  (void)settings::number("QCOMM_IPC_TASK_WARPS");  // invalid: refused at set-up, on every rank
  s.tileElems = settings::number("QCOMM_IPC_TILE_ELEMS");
  s.profileSlots = settings::flag("QCOMM_IPC_PROFILE") ? kIpcProfileSlots : 0;
  if (!s.separate) s.preload = fusedPreload;
#endif
  return s;
}

// The NCCL transport: the algorithms over the inner backend's collectives with the CUDA codec
// kernels on `stream`. Returns the encoded bytes this rank sends (the unpadded count: the
// all-to-all and all-gather pad units to one size).
int64_t runOverNccl(const Plan& plan, c10d::Backend& inner, int rank, at::Tensor& data,
                    const c10::cuda::CUDAStream& stream, std::chrono::milliseconds timeout) {
  C10dTransport t(&inner, rank, plan.world, timeout, C10dTransport::kCollectives,
                  /*streamOrdered=*/true);
  std::unique_ptr<CodecOps> ops = makeCudaCodecOps(stream.stream());
  runAllreduce(plan, t, *ops, data);
  int64_t wire = 0;
  for (int c = 0; c < plan.world; ++c) {
    const ChunkRange ch = plan.chunk(c);
    wire += c == rank ? (plan.world - 1) * encodedBytes(ch.len, plan.ag)
                      : encodedBytes(ch.len, plan.rs);
  }
  return wire;
}

// A call's schedule over CUDA IPC with the separate kernels: `schedule` on the exchanges of the
// group's buffers and the CUDA codec kernels on `stream`; `result` (the tensor the call writes)
// is poisoned if the call's kernels gave up. `lead`: what the schedule's errors start with after
// the rank ("allreduce: "). Returns the bytes this rank writes into its peers' buffers.
int64_t runSeparateIpc(const Plan& plan, IpcTransport& ipc, int rank, const at::Tensor& result,
                       const std::string& lead, const c10::cuda::CUDAStream& stream,
                       std::chrono::milliseconds timeout, bool eager,
                       const std::function<void(Transport&, CodecOps&)>& schedule) {
  int64_t sent = 0;
  std::string cause;
  try {
    // the call's first barrier compares the ranks' plan fingerprints on the device: the agreement
    // the host exchange of headers gives, off the host's critical path
    std::unique_ptr<Transport> t = ipc.exchanges(stream.stream(), timeout, planFingerprint(plan));
    std::unique_ptr<CodecOps> ops = makeCudaCodecOps(stream.stream());
    schedule(*t, *ops);
    // a call whose kernels gave up (a mismatch, a peer that died) leaves NaN, not numbers
    ipc.poisonIfAborted(static_cast<uint8_t*>(result.data_ptr()), result.nbytes(), stream.stream());
    sent = t->bytesSent();
  } catch (const c10::Error& e) {
    cause = e.what_without_backtrace();
  } catch (const std::exception& e) {
    cause = e.what();
  }
  if (!cause.empty()) {
    // the algorithm's errors already say "[qcomm rank r/W] allreduce: ": said once, by ended()
    for (const std::string& l : {rankPrefix(rank, plan.world), lead}) {
      if (cause.rfind(l, 0) == 0) cause = cause.substr(l.size());
    }
    cause = "the CUDA-IPC " + std::string(algoName(plan.algorithm)) +
            " (separate kernels) failed: " + cause;
  }
  ipc.ended(stream.stream(), eager, cause);
  return sent;
}

// An allreduce over CUDA IPC: the same schedule (two_step, ring or semi_ring), its exchanges as
// copy and barrier kernels through the buffers. Returns the bytes this rank writes into its
// peers' buffers.
int64_t runOverIpc(const Plan& plan, IpcTransport& ipc, int rank, at::Tensor& data,
                   const c10::cuda::CUDAStream& stream, std::chrono::milliseconds timeout,
                   bool eager) {
#ifdef QCOMM_EXPERIMENTS
  if (!ipc.separate()) {
    // the fused kernel is two_step's only, and quantizes the message as it is: it has no rotated
    // codec (every rank has the same plan and kernels, so every rank refuses, before any
    // exchange)
    TORCH_CHECK_VALUE(plan.algorithm == kTwoStep, rankPrefix(rank, plan.world),
                      "allreduce: ", algoName(plan.algorithm),
                      " needs the separate CUDA-IPC kernels (QCOMM_IPC_KERNELS=separate); the "
                      "fused two_step experiment runs two_step only");
    TORCH_CHECK_VALUE(
        !plan.rotate, rankPrefix(rank, plan.world),
        "allreduce: rotate=True needs the separate CUDA-IPC kernels "
        "(QCOMM_IPC_KERNELS=separate); the fused two_step experiment does not rotate");
    return runFusedTwoStep(ipc, plan, data, stream.stream(), timeout, eager);
  }
#endif
  return runSeparateIpc(plan, ipc, rank, data, "allreduce: ", stream, timeout, eager,
                        [&](Transport& t, CodecOps& ops) { runAllreduce(plan, t, ops, data); });
}

// The stream a call runs on: the caller's current one, or (onSide) the group's side stream, made
// to wait for the work already queued on the current one.
c10::cuda::CUDAStream streamForCall(const c10::cuda::CUDAStream& side,
                                    const c10::cuda::CUDAStream& current, bool onSide) {
  if (!onSide) return current;
  at::cuda::CUDAEvent ready;
  ready.record(current);
  ready.block(side);
  return side;
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
#ifdef QCOMM_EXPERIMENTS
  if (!cuda_ || !cuda_->ipc) return out;
  const std::vector<int64_t> v = cuda_->ipc->profile();
  for (size_t i = 0; i < v.size(); ++i) {
    out.emplace_back(i < size_t(kIpcPhases) ? kIpcPhaseNames[i] : "runs", v[i]);
  }
#endif
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
    IpcTransport::Settings settings;
    std::string settingsError;
    try {
      settings = ipcSettings();
    } catch (const std::exception& e) {
      settings = IpcTransport::Settings{};
      settings.mode = "invalid";
      settingsError = prefix() + e.what();
    }
    std::unique_ptr<CudaPath, CudaPathDeleter> p(
        new CudaPath(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device)));
    p->device = device;
    std::string mustFail;
    if (!store_) {
      p->note = "no store was given to the backend";
      if (settings.mode == "ipc") mustFail = "QCOMM_TRANSPORT=ipc but " + p->note;
    } else {
      // every rank takes part, whatever its mode, so that the verdict is the same everywhere
      p->ipc = IpcTransport::create(*store_, getRank(), getSize(), device, settings, &p->note,
                                    &mustFail);
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
  const int device = t.device().index();
  c10::cuda::CUDAGuard guard(t.device());
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device);
  const bool capturing = isCapturing(current);
  const auto timeout = callTimeout(opts);
  // Shadow mode compares with the exact result on the host, which would synchronize every
  // shadowed call with the device: it covers host-memory allreduces only (README)
  if (plan.shadow > 0) {
    TORCH_WARN_ONCE(prefix(), "allreduce: shadow mode (QuantConfig.shadow) covers host-memory ",
                    "allreduces only; this group's quantized CUDA allreduces are not shadowed");
  }
  plan.callSeq = callSeq_++;
  // Everything before the call's launches: an error here on this rank alone (the device check, an
  // allocation of the copies below) would leave its peers' calls spinning in their first barrier
  // until the group's timeout (30 minutes by default). Such an error takes the abort path of a
  // failed launch instead (IpcTransport::abandon: every rank's kernels stop, every rank raises at
  // its next call). Errors every rank raises alike (the host agreement's mismatch, an earlier
  // call's failure) do not: `shared` marks them. Under capture nothing is enqueued on the peers'
  // side yet, so an error there only raises.
  bool shared = false;
  try {
    CudaPath& path = cudaPath(device, capturing);
    const std::string pre = prefix();
    std::shared_ptr<IpcTransport> ipc = path.ipc;
    std::function<void()> check = [ipc, pre]() {
      if (ipc) ipc->checkError(pre);
    };
    // A non-contiguous input is copied now, on the caller's stream (where it is ready), before the
    // agreement: after it a peer may already wait in this call's first barrier for this rank, and
    // with ranks as threads of one process the copy kernel's first launch (lazy loading) or an
    // allocation that synchronises the device would wait for that peer.
    // A rotated message that ends inside a group runs on a copy padded with zeros to whole groups
    // (staging.h, as runQuantizedCpu's), made here for the same reason, and copied back into t at
    // the end.
    Staged msg(plan, t);
    // every quantized algorithm runs over CUDA IPC where the group set it up (two_step, ring and
    // semi_ring: their exchanges are all-to-all, all-gather or point-to-point legs, all of which
    // ipc_exchange.h runs)
    const bool useIpc = ipc && (plan.algorithm == kTwoStep || plan.algorithm == kRing ||
                                plan.algorithm == kSemiRing);
    // The ranks' agreement on the call. The separate IPC kernels check it on the device, in the
    // call's first barrier (plan fingerprints): no host round trip. The NCCL transport (whose
    // collectives of mismatched sizes would hang inside NCCL) and the fused experiment exchange
    // headers over Gloo on the host first; so does every call where the group checks its calls
    // (QCOMM_DEBUG=CHECK or TORCH_DISTRIBUTED_DEBUG=DETAIL on any rank, agreed at its creation),
    // where a mismatch then names its field and leaves the group usable. Host-side: nothing waits
    // for the device. The exchange runs on the group's progress thread, behind the host-memory
    // calls queued there: the inner Gloo pairs collectives by their order, which must be the same
    // on every rank (a CPU allreduce queued before this call goes first everywhere).
    shared = true;
    if (!useIpc || !ipc->separate() || checkCalls_) {
      agreeOnCudaCall(plan, timeout);
    }
    // an earlier call's kernel gave up: say so before enqueuing more. After the agreement, so that
    // a peer whose kernels ended cleanly is not left waiting in it: it enqueues, and its kernel
    // stops at once on the abort word the failed rank set in every buffer.
    check();
    TORCH_CHECK(useIpc || nccl_, prefix(), "allreduce: no NCCL backend for the ",
                algoName(plan.algorithm), " algorithm, and CUDA IPC is not set up for this group");
    shared = false;
    return launchCuda(plan, tensors, msg, path, useIpc, opts, std::move(check));
  } catch (const std::exception& e) {
    if (!shared && !capturing) abandonIpc(e);
    throw;
  }
}

c10::intrusive_ptr<c10d::Work> QncclBackend::launchCuda(const Plan& plan,
                                                        std::vector<at::Tensor>& tensors,
                                                        Staged& msg, CudaPath& path, bool useIpc,
                                                        const c10d::AllreduceOptions& opts,
                                                        std::function<void()> check) {
  at::Tensor& t = tensors[0];
  at::Tensor& buf = msg.data();
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(t.device().index());
  const std::shared_ptr<IpcTransport>& ipc = path.ipc;
  const auto timeout = callTimeout(opts);
  // Async ops run on the side stream. So do all IPC calls: they share the group's buffers and
  // device epoch, so one must end before the next starts, whatever stream the caller is on; a
  // sync call then makes the current stream wait at once.
  const bool onSide = opts.asyncOp || useIpc;
  const c10::cuda::CUDAStream run = streamForCall(path.side, current, onSide);
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
      wire = runOverIpc(plan, *ipc, getRank(), buf, run, timeout, !isCapturing(run));
    } else {
      wire = runOverNccl(plan, *nccl_, getRank(), buf, run, timeout);
    }
    msg.finish();
  }
  auto done = std::make_shared<at::cuda::CUDAEvent>();
  done->record(run);
  if (onSide && !opts.asyncOp) done->block(current);
  stats_.quantizedCalls++;
  stats_.inputBytes += t.numel() * t.element_size();
  stats_.wireBytes += wire;
  return c10::make_intrusive<CudaWork>(getRank(), tensors, std::move(done), run, std::move(check));
}

// A quantized reduce-scatter or all-gather of CUDA tensors (sharded.cpp hands it here once the
// call is planned and numbered): the allreduce's transport, agreement, streams and Work
// (allreduceCuda, launchCuda), the reduce half of plan.algorithm or the gather phase alone
// (runSharded) with the CUDA codec kernels, over CUDA IPC where the group set it up with the
// separate kernels, else over the inner NCCL backend.
void QncclBackend::abandonIpc(const std::exception& e) {
  std::shared_ptr<IpcTransport> ipc;
  {
    std::lock_guard<std::mutex> lock(cudaMutex_);
    if (cuda_) ipc = cuda_->ipc;
  }
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  if (ipc) ipc->abandon(c10 ? c10->what_without_backtrace() : e.what());
}

c10::intrusive_ptr<c10d::Work> QncclBackend::shardedCuda(const Plan& plan, ShardedCall& call) {
  const at::Tensor& t = call.message;
  const int device = t.device().index();
  c10::cuda::CUDAGuard guard(t.device());
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device);
  const bool capturing = isCapturing(current);
  if (plan.shadow > 0) {
    TORCH_WARN_ONCE(prefix(), call.name, ": shadow mode (QuantConfig.shadow) covers host-memory ",
                    "calls only; this group's quantized CUDA calls are not shadowed");
  }
  // as allreduceCuda: an error on this rank alone before the launches takes the abort path of
  // the IPC transport (its peers may wait in the call's first barrier); a shared one only raises
  bool shared = false;
  try {
    CudaPath& path = cudaPath(device, capturing);
    const std::string pre = prefix();
    std::shared_ptr<IpcTransport> ipc = path.ipc;
    std::function<void()> check = [ipc, pre]() {
      if (ipc) ipc->checkError(pre);
    };
    // the buffers, before the agreement (allreduceCuda says why), on the caller's stream
    ShardedStage st = stageSharded(plan, call);
    // the fused experiment runs the allreduce's two_step only: its groups' sharded calls take
    // the NCCL transport
    const bool useIpc = ipc && ipc->separate();
    shared = true;
    if (!useIpc || checkCalls_) {
      std::string mismatch = agreeOnQueue(plan, call.timeout);
      TORCH_CHECK(mismatch.empty(), prefix(), call.name,
                  ": the ranks disagree on this call: ", mismatch,
                  ". Every rank must pass the same shapes, dtype and op, and hold the same "
                  "QuantConfig (qcomm.set_config on every rank).");
    }
    check();
    TORCH_CHECK(useIpc || nccl_, prefix(), call.name, ": no NCCL backend for the ",
                algoName(plan.algorithm), " algorithm, and CUDA IPC is not set up for this group");
    shared = false;
    // async ops and every IPC call on the side stream (launchCuda says why)
    const bool onSide = call.asyncOp || useIpc;
    const c10::cuda::CUDAStream run = streamForCall(path.side, current, onSide);
    int64_t wire = 0;
    {
      c10::cuda::CUDAStreamGuard onRun(run);
      if (onSide) {
        std::vector<at::Tensor> used = call.outputs;
        used.insert(used.end(), {call.message, call.shard, st.message.data()});
        if (st.shard.data().defined()) used.push_back(st.shard.data());
        for (const at::Tensor& u : used) {
          if (u.defined() && u.numel() > 0) {
            c10::cuda::CUDACachingAllocator::recordStream(u.storage().data_ptr(), run);
          }
        }
      }
      const at::Tensor& result =
          plan.collective == kReduceScatter ? st.shard.data() : st.message.data();
      const std::string lead = std::string(collectiveName(plan.collective)) + ": ";
      if (useIpc) {
        wire = runSeparateIpc(
            plan, *ipc, getRank(), result, lead, run, call.timeout, !isCapturing(run),
            [&](Transport& tr, CodecOps& ops) { runSharded(plan, call, st, tr, ops, nullptr); });
      } else {
        C10dTransport tr(nccl_.get(), getRank(), plan.world, call.timeout,
                         C10dTransport::kCollectives, /*streamOrdered=*/true);
        std::unique_ptr<CodecOps> ops = makeCudaCodecOps(run.stream());
        runSharded(plan, call, st, tr, *ops, nullptr);
        wire = tr.bytesSent();
      }
    }
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    done->record(run);
    if (onSide && !call.asyncOp) done->block(current);
    countSharded(plan, call, wire);
    return c10::make_intrusive<CudaWork>(getRank(), call.outputs, std::move(done), run,
                                         std::move(check));
  } catch (const std::exception& e) {
    if (!shared && !capturing) abandonIpc(e);
    throw;
  }
}

}  // namespace qcomm

#endif  // QCOMM_WITH_CUDA
