// QncclBackend: routing, eligibility, and the quantized allreduce on host memory.
#include "backend/backend.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

#include "algo/algorithms.h"
#include "backend/work.h"
#include "codec/codec_cpu.h"
#include "codec/codec_ops.h"
#include "common/errors.h"
#include "common/settings.h"
#include "common/torch_dtype.h"
#include "transport/c10d_transport.h"

namespace qcomm {
namespace {
std::atomic<int64_t> liveBackends{0};
}  // namespace

int64_t QncclBackend::liveCount() { return liveBackends.load(); }

QncclBackend::QncclBackend(int rank, int size, std::chrono::milliseconds timeout,
                           c10::intrusive_ptr<c10d::Backend> gloo,
                           c10::intrusive_ptr<c10d::Backend> nccl, const QuantConfig& config,
                           c10::intrusive_ptr<c10d::Store> store, bool disabled)
    : c10d::Backend(rank, size),
      timeout_(timeout),
      gloo_(std::move(gloo)),
      nccl_(std::move(nccl)),
      store_(std::move(store)),
      config_(config),
      disabled_(disabled) {
  TORCH_CHECK(gloo_, prefix(), "qnccl needs an inner Gloo backend");
  validateConfig(config_);
  init();
  liveBackends.fetch_add(1);
}

QncclBackend::~QncclBackend() { liveBackends.fetch_sub(1); }

std::string QncclBackend::prefix() const { return rankPrefix(getRank(), getSize()); }

void QncclBackend::setConfig(const QuantConfig& config) {
  validateConfig(config);
  std::lock_guard<std::mutex> lock(configMutex_);
  config_ = config;
}

QuantConfig QncclBackend::getConfig() const {
  std::lock_guard<std::mutex> lock(configMutex_);
  return config_;
}

void QncclBackend::resetStats() {
  stats_.quantizedCalls = 0;
  stats_.passthroughCalls = 0;
  stats_.inputBytes = 0;
  stats_.wireBytes = 0;
}

c10d::Backend* QncclBackend::pick(const at::Tensor& t, const char* op) const {
  TORCH_CHECK(!shutDown_, prefix(), op, ": the process group has been shut down");
  if (t.is_cuda()) {
    TORCH_CHECK(nccl_, prefix(), op,
                ": got a CUDA tensor but this qnccl group has no NCCL backend (CUDA was not "
                "available when the group was created)");
    return nccl_.get();
  }
  TORCH_CHECK_VALUE(t.device().is_cpu(), prefix(), op, ": tensors on ", t.device(),
                    " are not supported; qnccl takes CPU and CUDA tensors");
  return gloo_.get();
}

void QncclBackend::refuseOverlap(const std::vector<at::Tensor>& ts, const char* op) const {
  for (const at::Tensor& t : ts) {
    TORCH_CHECK_VALUE(
        t.layout() != at::kStrided || at::has_internal_overlap(t) != at::MemOverlap::Yes, prefix(),
        op, ": a tensor whose elements overlap in memory (an expanded view: stride 0 over ",
        t.sizes(), ") cannot be sent or written into; pass t.clone() or t.contiguous()");
  }
}

void QncclBackend::refuseOverlap(const std::vector<std::vector<at::Tensor>>& ts,
                                 const char* op) const {
  for (const auto& v : ts) refuseOverlap(v, op);
}

c10d::Backend* QncclBackend::pickAll(const std::vector<at::Tensor>& ts, const char* op) const {
  TORCH_CHECK_VALUE(!ts.empty(), prefix(), op, ": no tensors given");
  refuseOverlap(ts, op);
  const_cast<Stats&>(stats_).passthroughCalls++;
  return pick(ts.front(), op);
}

Plan QncclBackend::planFor(const at::Tensor& t, c10d::ReduceOp op) const {
  CallFacts f;
  f.numel = t.numel();
  f.dtype = dtypeOf(t.scalar_type());
  f.opSum = op.op_ == c10d::ReduceOp::SUM;
  f.opAvg = op.op_ == c10d::ReduceOp::AVG;
  // torch.distributed.all_reduce hands complex tensors to backends as view_as_real(t): a real
  // view whose base is complex. Those pass through too (DESIGN invariant 4).
  const bool complexView = t.is_view() && t._base().is_complex();
  f.sparseOrComplex = t.is_sparse() || t.is_complex() || complexView || t.layout() != at::kStrided;
  f.world = getSize();
  Plan p = makePlan(f, getConfig());
  if (disabled_) {
    p.quantize = false;
    p.reason = "QCOMM_DISABLE=1: every collective passes through";
    return p;
  }
  if (p.quantize && t.is_cuda()) {
#ifdef QCOMM_WITH_CUDA
    // Opt-in until the CUDA transports have run on a GPU (README, "CUDA tensors"): by default a
    // CUDA allreduce stays NCCL's, exactly.
    if (!settings::flag("QCOMM_CUDA_QUANTIZE")) {
      p.quantize = false;
      p.reason = "CUDA tensor: quantizing CUDA allreduces is opt-in (QCOMM_CUDA_QUANTIZE=1)";
    }
#else
    p.quantize = false;
    p.reason = "CUDA tensor: qcomm was built without CUDA";
#endif
  }
  return p;
}

namespace {

// A dtype as Python spells it (torch.float32: "float32").
std::string dtypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kLong:
      return "int64";
    case at::kInt:
      return "int32";
    case at::kShort:
      return "int16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(t);
  }
}

// A power of two of bytes, 2^k: "4 KiB".
std::string bytesName(int k) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  const int u = std::min(k / 10, 4);
  return std::to_string(int64_t(1) << (k - 10 * u)) + " " + units[u];
}

constexpr int64_t kQuietCalls = 100;

}  // namespace

void QncclBackend::logDecision(const Plan& plan, const at::Tensor& t, c10d::ReduceOp op) {
  if (getRank() != 0 || settings::text("QCOMM_DEBUG") != "INFO") return;
  const int64_t bytes = t.numel() * int64_t(t.element_size());
  int k = 0;
  while (k < 62 && (int64_t(2) << k) <= bytes) ++k;  // bytes in [2^k, 2^(k+1))
  std::string what;
  if (plan.quantize) {
    auto bits = [](int b) { return b == 0 ? std::string("none") : std::to_string(b); };
    what = std::string("quantized with ") + algoName(plan.algorithm) + " " + bits(plan.rs.bits) +
           "/" + bits(plan.ag.bits) + ", groups of " + std::to_string(plan.rs.groupSize);
  } else {
    what = "passed through: " + plan.reason;
  }
  const std::string dtype = dtypeName(t.scalar_type());
  const std::string size =
      bytes == 0 ? std::string("0 B") : bytesName(k) + " to " + bytesName(k + 1);
  std::string quiet;
  bool fresh = false;
  {
    std::lock_guard<std::mutex> lock(logMutex_);
    const bool eligible = dtypeOf(t.scalar_type()) >= 0 && t.layout() == at::kStrided &&
                          !t.is_complex() &&
                          (op.op_ == c10d::ReduceOp::SUM || op.op_ == c10d::ReduceOp::AVG);
    if (eligible) ++eligibleCalls_;
    const QuantConfig c = getConfig();
    const bool asks = !disabled_ && c.algorithm != kAlgoNone && (c.rsBits || c.agBits);
    if (eligible && asks && !quietLogged_ && eligibleCalls_ >= kQuietCalls &&
        stats_.quantizedCalls.load() == 0 && !plan.quantize) {
      quietLogged_ = true;
      quiet = std::to_string(kQuietCalls) +
              " allreduces of fp32, fp16 or bf16 tensors on this group, none of them quantized; "
              "the last passed through: " +
              plan.reason + " (min_bytes " + std::to_string(c.minBytes) + ")";
    }
    fresh = logged_.insert(size + "/" + dtype + "/" + what).second;
  }
  if (!quiet.empty()) {
    std::fprintf(stderr, "%sINFO allreduce: %s\n", prefix().c_str(), quiet.c_str());
  }
  if (!fresh) return;
  std::fprintf(stderr, "%sINFO allreduce of %s (%s): %s\n", prefix().c_str(), size.c_str(),
               dtype.c_str(), what.c_str());
}

c10::intrusive_ptr<c10d::Work> QncclBackend::passThroughAllreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return pickAll(tensors, "allreduce")->allreduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), prefix(), "allreduce: no tensors given");
  if (tensors.size() != 1) return passThroughAllreduce(tensors, opts);
  at::Tensor& t = tensors[0];
  TORCH_CHECK(!shutDown_, prefix(), "allreduce: the process group has been shut down");
  TORCH_CHECK_VALUE(t.device().is_cpu() || t.is_cuda(), prefix(), "allreduce: tensors on ",
                    t.device(), " are not supported; qnccl takes CPU and CUDA tensors");
  refuseOverlap(tensors, "allreduce");
  // the result is written into the caller's tensor as Gloo and NCCL write it, outside autograd
  // (a non-contiguous view of a leaf that requires grad gets its result copied back too)
  const at::NoGradGuard noGrad;
  Plan plan = planFor(t, opts.reduceOp);
  logDecision(plan, t, opts.reduceOp);
  if (!plan.quantize) return passThroughAllreduce(tensors, opts);
#ifdef QCOMM_WITH_CUDA
  if (t.is_cuda()) return allreduceCuda(plan, tensors, opts);
#endif
  plan.callSeq = callSeq_++;
  runQuantizedCpu(plan, t, callTimeout(opts));
  return c10::make_intrusive<CompletedWork>(getRank(), tensors);
}

std::chrono::milliseconds QncclBackend::callTimeout(const c10d::AllreduceOptions& opts) const {
  return opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
}

#ifndef QCOMM_WITH_CUDA
struct CudaPath {};
void CudaPathDeleter::operator()(CudaPath* p) const { delete p; }
std::string QncclBackend::cudaTransport() const { return ""; }
std::string QncclBackend::cudaIpcKernels() const { return ""; }
std::vector<std::pair<std::string, int64_t>> QncclBackend::cudaIpcProfile() const { return {}; }
std::string QncclBackend::cudaTransportNote() const {
  return "qcomm was built without CUDA: CUDA allreduces pass through to NCCL";
}
#endif

void QncclBackend::runQuantizedCpu(const Plan& plan, at::Tensor& tensor,
                                   std::chrono::milliseconds timeout) {
  // Work on a contiguous buffer; a non-contiguous input gets the result copied back (in place).
  at::Tensor buf = tensor.is_contiguous() ? tensor : tensor.contiguous();
  C10dTransport transport(gloo_.get(), getRank(), getSize(), timeout, C10dTransport::kPointToPoint);
  agreeOnPlan(plan, transport);
  CpuCodecOps ops;
  if (plan.rotate) {
    // the algorithm runs in place on the fp32 rotated message, then it is rotated back
    at::Tensor rotated = at::empty({plan.numel}, at::kFloat);
    rotateForward(buf.data_ptr(), plan.userDtype, plan.userNumel, plan.rs.groupSize,
                  rotated.data_ptr<float>());
    runAllreduce(plan, transport, ops, rotated);
    rotateInverse(rotated.data_ptr<float>(), plan.numel, plan.rs.groupSize);
    castFromFloat(rotated.data_ptr<float>(), plan.userNumel, plan.userDtype, buf.data_ptr());
  } else {
    runAllreduce(plan, transport, ops, buf);
  }
  if (!buf.is_same(tensor)) tensor.copy_(buf);
  stats_.quantizedCalls++;
  stats_.inputBytes += tensor.numel() * tensor.element_size();
  stats_.wireBytes += transport.bytesSent();
}

void QncclBackend::agreeOnPlan(const Plan& plan, C10dTransport& t) {
  const PlanHeader mine = headerOf(plan);
  at::Tensor send = at::empty({int64_t(sizeof(PlanHeader))}, at::kByte);
  at::Tensor recv = at::empty({int64_t(sizeof(PlanHeader)) * getSize()}, at::kByte);
  std::memcpy(send.data_ptr(), &mine, sizeof(PlanHeader));
  t.allGatherNow(recv, send, "exchange of the call's header (numel, dtype, op, config)");
  std::vector<PlanHeader> all(static_cast<size_t>(getSize()));
  std::memcpy(all.data(), recv.data_ptr(), sizeof(PlanHeader) * all.size());
  const std::string mismatch = describeMismatch(all);
  TORCH_CHECK(mismatch.empty(), prefix(), "allreduce: the ranks disagree on this call: ", mismatch,
              ". Every rank must pass the same numel, dtype and op, and hold the same QuantConfig "
              "(qcomm.set_config on every rank).");
}

// ---- pass-through ----

c10::intrusive_ptr<c10d::Work> QncclBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  return pickAll(tensors, "broadcast")->broadcast(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  return pickAll(tensors, "allreduce_sparse")->allreduce_sparse(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return pickAll(tensors, "allreduce_coalesced")->allreduce_coalesced(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::reduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::ReduceOptions& opts) {
  return pickAll(tensors, "reduce")->reduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  refuseOverlap(outputs, "allgather");
  return pickAll(inputs, "allgather")->allgather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  refuseOverlap({output}, "all_gather_into_tensor");
  return pickAll({input}, "all_gather_into_tensor")->_allgather_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  refuseOverlap(outputs, "allgather_coalesced");
  return pickAll(inputs, "allgather_coalesced")->allgather_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  refuseOverlap(outputs, "allgather_into_tensor_coalesced");
  return pickAll(inputs, "allgather_into_tensor_coalesced")
      ->allgather_into_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::GatherOptions& opts) {
  refuseOverlap(outputs, "gather");
  return pickAll(inputs, "gather")->gather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  refuseOverlap(inputs, "scatter");
  return pickAll(outputs, "scatter")->scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  refuseOverlap(inputs, "reduce_scatter");
  return pickAll(outputs, "reduce_scatter")->reduce_scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  refuseOverlap({output}, "reduce_scatter_tensor");
  return pickAll({input}, "reduce_scatter_tensor")->_reduce_scatter_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  refuseOverlap(outputs, "reduce_scatter_tensor_coalesced");
  return pickAll(inputs, "reduce_scatter_tensor_coalesced")
      ->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& outputSplits,
                                                           std::vector<int64_t>& inputSplits,
                                                           const c10d::AllToAllOptions& opts) {
  refuseOverlap({output}, "all_to_all_single");
  return pickAll({input}, "all_to_all_single")
      ->alltoall_base(output, input, outputSplits, inputSplits, opts);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  refuseOverlap(outputs, "all_to_all");
  return pickAll(inputs, "all_to_all")->alltoall(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::send(std::vector<at::Tensor>& tensors, int dstRank,
                                                  int tag) {
  return pickAll(tensors, "send")->send(tensors, dstRank, tag);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::recv(std::vector<at::Tensor>& tensors, int srcRank,
                                                  int tag) {
  return pickAll(tensors, "recv")->recv(tensors, srcRank, tag);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                           int tag) {
  return pickAll(tensors, "recv_anysource")->recvAnysource(tensors, tag);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::barrier(const c10d::BarrierOptions& opts) {
  TORCH_CHECK(!shutDown_, prefix(), "barrier: the process group has been shut down");
  stats_.passthroughCalls++;
  const bool cuda = (opts.device.has_value() && opts.device->is_cuda()) || !opts.device_ids.empty();
  if (cuda && nccl_) return nccl_->barrier(opts);
  return gloo_->barrier(opts);
}

void QncclBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  TORCH_CHECK(!shutDown_, prefix(), "monitored_barrier: the process group has been shut down");
  stats_.passthroughCalls++;
  gloo_->monitoredBarrier(opts, waitAllRanks);
}

void QncclBackend::setSequenceNumberForGroup() { gloo_->setSequenceNumberForGroup(); }

uint64_t QncclBackend::getSequenceNumberForGroup() { return gloo_->getSequenceNumberForGroup(); }

void QncclBackend::startCoalescing() {
  TORCH_CHECK(nccl_, prefix(), "coalescing needs the NCCL backend");
  nccl_->startCoalescing();
}

c10::intrusive_ptr<c10d::Work> QncclBackend::endCoalescing() {
  TORCH_CHECK(nccl_, prefix(), "coalescing needs the NCCL backend");
  return nccl_->endCoalescing();
}

void QncclBackend::shutdown() {
  if (shutDown_.exchange(true)) return;  // idempotent: destroy_process_group may call it twice
  if (nccl_) nccl_->shutdown();
  gloo_->shutdown();
}

void QncclBackend::abort() {
  if (shutDown_.exchange(true)) return;
  if (nccl_) nccl_->abort();
  gloo_->abort();
}

}  // namespace qcomm
