// The CUDA form of a quantized call (call.h runCuda) and the group's CUDA side (cuda_side.h):
// transport choice, streams and Work, as ProcessGroupNCCL does them. Built only with CUDA.
//
// Streams: the input is taken as ready on the caller's current stream. An async op (asyncOp)
// runs on the group's side stream after an event recorded on the current stream; its Work's
// wait() makes the then-current stream wait for the end event, without blocking the host.
// asyncOp=false (torch 2.8+) runs on the current stream itself with the NCCL transport; with the
// IPC transport every call runs on the side stream (calls share the group's buffers and device
// epoch, so they must not overlap, whatever stream each caller is on) and a sync call makes the
// current stream wait for it at once. Nothing here synchronizes with the device, so the op can
// be captured in a CUDA graph once the group's transport is set up (the first quantized CUDA
// call does that).
#ifdef QCOMM_WITH_CUDA

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include "algo/algorithms.h"
#include "backend/call.h"
#include "backend/cuda_side.h"
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

// The encoded bytes an allreduce over the NCCL transport sends from this rank (the unpadded
// count: the all-to-all and all-gather pad units to one size).
int64_t ncclAllreduceWire(const Plan& plan, int rank) {
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

#ifdef QCOMM_EXPERIMENTS
// An allreduce with the fused two_step experiment (QCOMM_IPC_KERNELS=fused). Returns the bytes
// this rank writes into its peers' buffers.
int64_t runFused(const Plan& plan, IpcTransport& ipc, int rank, at::Tensor& data,
                 const c10::cuda::CUDAStream& stream, std::chrono::milliseconds timeout,
                 bool eager) {
  // the fused kernel is two_step's only, and quantizes the message as it is: it has no rotated
  // codec (every rank has the same plan and kernels, so every rank refuses, before any exchange)
  TORCH_CHECK_VALUE(plan.algorithm == kTwoStep, rankPrefix(rank, plan.world),
                    "allreduce: ", algoName(plan.algorithm),
                    " needs the separate CUDA-IPC kernels (QCOMM_IPC_KERNELS=separate); the "
                    "fused two_step experiment runs two_step only");
  TORCH_CHECK_VALUE(!plan.rotate, rankPrefix(rank, plan.world),
                    "allreduce: rotate=True needs the separate CUDA-IPC kernels "
                    "(QCOMM_IPC_KERNELS=separate); the fused two_step experiment does not rotate");
  return runFusedTwoStep(ipc, plan, data, stream.stream(), timeout, eager);
}
#endif

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

// Every quantized algorithm of an allreduce runs over CUDA IPC where the group set it up
// (two_step, ring and semi_ring: their exchanges are all-to-all, all-gather or point-to-point
// legs, all of which ipc_exchange.h runs); the fused experiment runs the allreduce's two_step
// only, so its groups' reduce-scatters and all-gathers take the NCCL transport.
bool usesIpc(const Plan& plan, const IpcTransport* ipc) {
  if (ipc == nullptr) return false;
  if (plan.collective != kAllreduce) return ipc->separate();
  return plan.algorithm == kTwoStep || plan.algorithm == kRing || plan.algorithm == kSemiRing;
}

// The call's tensors are used on the side stream: their memory must not be reused before
// (recorded before the launch, so that a launch failing part-way is covered too).
void recordStreams(const Call& call, CallStage& st, const c10::cuda::CUDAStream& run) {
  std::vector<at::Tensor> used = call.outputs;
  used.insert(used.end(), {call.message, call.shard, st.message.data(), st.shard.data()});
  for (const at::Tensor& u : used) {
    if (u.defined() && u.numel() > 0) {
      c10::cuda::CUDACachingAllocator::recordStream(u.storage().data_ptr(), run);
    }
  }
}

// The ranks' agreement on a CUDA call. The separate IPC kernels check it on the device, in the
// call's first barrier (plan fingerprints): no host round trip. The NCCL transport (whose
// collectives of mismatched sizes would hang inside NCCL) and the fused experiment exchange
// headers over Gloo on the host first; so does every call where the group checks its calls
// (QCOMM_DEBUG=CHECK or TORCH_DISTRIBUTED_DEBUG=DETAIL on any rank, agreed at its creation), where
// a mismatch then names its field and leaves the group usable. Host-side: nothing waits for the
// device. The exchange runs on the group's progress thread, behind the host-memory calls queued
// there: the inner Gloo pairs collectives by their order, which must be the same on every rank.
void agreeCuda(Group& g, const Plan& plan, const Call& call, bool useIpc, IpcTransport* ipc) {
  if (!useIpc || !ipc->separate() || g.checkCalls) {
    g.requireAgreement(g.agreeOnQueue(plan, call.timeout), call.name, call.collective);
  }
}

// The launches of an agreed call on `run`; returns the bytes this rank sent.
int64_t launch(Group& g, CudaPath& path, const Plan& plan, Call& call, CallStage& st, bool useIpc,
               const c10::cuda::CUDAStream& run) {
  IpcTransport* ipc = path.ipc.get();
  int64_t wire = 0;
  c10::cuda::CUDAStreamGuard onRun(run);
#ifdef QCOMM_EXPERIMENTS
  if (useIpc && !ipc->separate()) {
    wire = runFused(plan, *ipc, g.rank, st.message.data(), run, call.timeout, !isCapturing(run));
    finishCall(call, st);
    return wire;
  }
#endif
  if (useIpc) {
    const std::string lead = call.collective == kAllreduce
                                 ? "allreduce: "
                                 : std::string(collectiveName(call.collective)) + ": ";
    wire = runSeparateIpc(
        plan, *ipc, g.rank, st.result(), lead, run, call.timeout, !isCapturing(run),
        [&](Transport& tr, CodecOps& ops) { runSchedule(plan, st, tr, ops, nullptr); });
  } else {
    C10dTransport tr(g.nccl.get(), g.rank, plan.world, call.timeout, C10dTransport::kCollectives,
                     /*streamOrdered=*/true);
    std::unique_ptr<CodecOps> ops = makeCudaCodecOps(run.stream());
    runSchedule(plan, st, tr, *ops, nullptr);
    wire = call.collective == kAllreduce ? ncclAllreduceWire(plan, g.rank) : tr.bytesSent();
  }
  finishCall(call, st);
  return wire;
}

}  // namespace

CudaInfo CudaSide::info() const {
  std::lock_guard<std::mutex> lock(mutex_);
  CudaInfo out;
  if (!path_) return out;
  out.transport = path_->ipc ? "ipc" : "nccl";
  out.note = path_->note;
  if (!path_->ipc) return out;
  out.kernels = path_->ipc->separate() ? "separate" : "fused";
#ifdef QCOMM_EXPERIMENTS
  const std::vector<int64_t> v = path_->ipc->profile();
  for (size_t i = 0; i < v.size(); ++i) {
    out.profile.emplace_back(i < size_t(kIpcPhases) ? kIpcPhaseNames[i] : "runs", v[i]);
  }
#endif
  return out;
}

CudaPath& CudaSide::path(int device, bool capturing) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (path_) {
    TORCH_CHECK_VALUE(path_->device == device, g_.prefix(),
                      "this group's quantized CUDA calls run on cuda:", path_->device,
                      ", got a tensor on cuda:", device,
                      "; use one device per rank and group, as with NCCL");
    return *path_;
  }
  // the set-up runs once: a failure (a store time-out, QCOMM_TRANSPORT=ipc refused) stays, so
  // that no rank ever repeats the store rounds alone
  TORCH_CHECK(setupError_.empty(), setupError_);
  TORCH_CHECK(!capturing, g_.prefix(),
              "the first quantized CUDA call of a group sets up its transport (buffers, "
              "handles) and cannot run under CUDA graph capture; run one allreduce on the group "
              "before capturing (a warm-up, as torch.cuda.graph recommends)");
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
      settingsError = g_.prefix() + e.what();
    }
    std::unique_ptr<CudaPath, CudaPathDeleter> p(
        new CudaPath(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device)));
    p->device = device;
    std::string mustFail;
    if (!g_.store) {
      p->note = "no store was given to the backend";
      if (settings.mode == "ipc") mustFail = "QCOMM_TRANSPORT=ipc but " + p->note;
    } else {
      // every rank takes part, whatever its mode, so that the verdict is the same everywhere
      p->ipc =
          IpcTransport::create(*g_.store, g_.rank, g_.size, device, settings, &p->note, &mustFail);
    }
    TORCH_CHECK_VALUE(settingsError.empty(), settingsError);
    TORCH_CHECK(mustFail.empty(), g_.prefix(), mustFail);
    path_ = std::move(p);
  } catch (const c10::Error& e) {
    setupError_ = e.what_without_backtrace();
    throw;
  } catch (const std::exception& e) {
    setupError_ = e.what();
    throw;
  }
  return *path_;
}

void CudaSide::abandon(const std::exception& e) {
  std::shared_ptr<IpcTransport> ipc;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (path_) ipc = path_->ipc;
  }
  const auto* c10 = dynamic_cast<const c10::Error*>(&e);
  if (ipc) ipc->abandon(c10 ? c10->what_without_backtrace() : e.what());
}

c10::intrusive_ptr<c10d::Work> runCuda(Group& g, CudaSide& cuda, const Plan& plan, Call& call) {
  const int device = call.message.device().index();
  c10::cuda::CUDAGuard guard(call.message.device());
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device);
  const bool capturing = isCapturing(current);
  if (call.config.shadow > 0) {
    TORCH_WARN_ONCE(g.prefix(), call.name, ": shadow mode (QuantConfig.shadow) covers ",
                    "host-memory calls only; this group's quantized CUDA calls are not shadowed");
  }
  // Everything before the call's launches: an error here on this rank alone (the device check,
  // an allocation of the copies below) would leave its peers' calls spinning in their first
  // barrier until the group's timeout (30 minutes by default). Such an error takes the abort
  // path of a failed launch instead (IpcTransport::abandon: every rank's kernels stop, every
  // rank raises at its next call). Errors every rank raises alike (the host agreement's
  // mismatch, an earlier call's failure) do not: `shared` marks them. Under capture nothing is
  // enqueued on the peers' side yet, so an error there only raises.
  bool shared = false;
  try {
    CudaPath& path = cuda.path(device, capturing);
    std::shared_ptr<IpcTransport> ipc = path.ipc;
    std::function<void()> check = [ipc, pre = g.prefix()]() {
      if (ipc) ipc->checkError(pre);
    };
    // The buffers (a non-contiguous input's copy, a rotated message's padded copy, the
    // all-gather's input in its slot) are staged now, on the caller's stream (where the input
    // is ready), before the agreement: after it a peer may already wait in this call's first
    // barrier for this rank, and with ranks as threads of one process the copy kernel's first
    // launch (lazy loading) or an allocation that synchronises the device would wait for it.
    CallStage st = stageCall(g, plan, call, nullptr);
    const bool useIpc = usesIpc(plan, ipc.get());
    shared = true;
    agreeCuda(g, plan, call, useIpc, ipc.get());
    // an earlier call's kernel gave up: say so before enqueuing more. After the agreement, so
    // that a peer whose kernels ended cleanly is not left waiting in it: it enqueues, and its
    // kernel stops at once on the abort word the failed rank set in every buffer.
    check();
    TORCH_CHECK(useIpc || g.nccl, g.prefix(), call.name, ": no NCCL backend for the ",
                algoName(plan.algorithm), " algorithm, and CUDA IPC is not set up for this group");
    shared = false;
    // Async ops run on the side stream. So do all IPC calls: they share the group's buffers and
    // device epoch, so one must end before the next starts, whatever stream the caller is on; a
    // sync call then makes the current stream wait at once.
    const bool onSide = call.asyncOp || useIpc;
    const c10::cuda::CUDAStream run = streamForCall(path.side, current, onSide);
    if (onSide) recordStreams(call, st, run);
    const int64_t wire = launch(g, path, plan, call, st, useIpc, run);
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    done->record(run);
    if (onSide && !call.asyncOp) done->block(current);
    countCall(g, plan, call, wire);
    return c10::make_intrusive<CudaWork>(g.rank, call.outputs, std::move(done), run,
                                         std::move(check));
  } catch (const std::exception& e) {
    if (!shared && !capturing) cuda.abandon(e);
    throw;
  }
}

}  // namespace qcomm

#else  // without CUDA: the group's CUDA side says so

#include "backend/cuda_side.h"

namespace qcomm {

struct CudaPath {};
void CudaPathDeleter::operator()(CudaPath* p) const { delete p; }

CudaInfo CudaSide::info() const {
  CudaInfo out;
  out.note = "qcomm was built without CUDA: CUDA calls pass through to NCCL";
  return out;
}

}  // namespace qcomm

#endif  // QCOMM_WITH_CUDA
