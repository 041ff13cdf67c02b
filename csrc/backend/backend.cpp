// QncclBackend: routing, eligibility, and the quantized allreduce on host memory.
#include "backend/backend.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <omp.h>
#include <torch/csrc/distributed/c10d/debug.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>

#include "algo/algorithms.h"
#include "backend/names.h"
#include "backend/progress.h"
#include "backend/staging.h"
#include "backend/work.h"
#include "codec/codec_cpu.h"
#include "codec/codec_ops.h"
#include "common/errors.h"
#include "common/settings.h"
#include "common/torch_dtype.h"
#include "transport/c10d_transport.h"

namespace qcomm {
namespace {
using Clock = std::chrono::steady_clock;
std::atomic<int64_t> liveBackends{0};
}  // namespace

int64_t QncclBackend::liveCount() { return liveBackends.load(); }

QncclBackend::QncclBackend(int rank, int size, std::chrono::milliseconds timeout,
                           c10::intrusive_ptr<c10d::Backend> gloo,
                           c10::intrusive_ptr<c10d::Backend> nccl, const QuantConfig& config,
                           c10::intrusive_ptr<c10d::Store> store, bool disabled, int cpuThreads,
                           int checkCalls)
    : c10d::Backend(rank, size),
      timeout_(timeout),
      gloo_(std::move(gloo)),
      nccl_(std::move(nccl)),
      store_(std::move(store)),
      config_(config),
      disabled_(disabled),
      checkCalls_(checkCalls >= 0 ? checkCalls != 0
                                  : (settings::text("QCOMM_DEBUG") == "CHECK" ||
                                     c10d::debug_level() == c10d::DebugLevel::Detail)),
      cpuThreads_(cpuThreads) {
  TORCH_CHECK_VALUE(cpuThreads >= 0, prefix(), "cpu_threads must be >= 0, got ", cpuThreads);
  TORCH_CHECK(gloo_, prefix(), "qnccl needs an inner Gloo backend");
  validateConfig(config_);
  init();
  liveBackends.fetch_add(1);
}

QncclBackend::~QncclBackend() {
  queue_.stop(std::chrono::milliseconds(0), prefix() + "the group was destroyed");
  liveBackends.fetch_sub(1);
}

std::string QncclBackend::prefix() const { return rankPrefix(getRank(), getSize()); }

void QncclBackend::setConfig(const QuantConfig& config) {
  validateConfig(config);
  std::lock_guard<std::mutex> lock(configMutex_);
  if (!sameTuningKey(config_, config)) {
    // the table was measured with other bits, groups or min_bytes: it no longer says what is
    // fastest, and the cache file is keyed by the config the group was created with
    std::lock_guard<std::mutex> t(tuningMutex_);
    tuning_.clear();
    tuneFile_.clear();
  }
  config_ = config;
}

std::vector<std::string> QncclBackend::exchangeConfig(const std::string& mine) {
  TORCH_CHECK(!shutDown_, prefix(), "set_config: the process group has been shut down");
  const int size = getSize();
  if (size == 1 || !store_) return std::vector<std::string>(size_t(size), mine);
  auto texts = std::make_shared<std::vector<std::string>>(size_t(size));
  auto work = c10::make_intrusive<QueuedWork>(getRank(), c10d::OpType::UNKNOWN, "qnccl:set_config",
                                              std::vector<at::Tensor>{}, std::vector<at::Tensor>{});
  work->setQueue(queue_.identity());
  auto self = c10::intrusive_ptr<QncclBackend>::reclaim_copy(this);
  auto run = [self, mine, texts, work, size] {
    const int rank = self->getRank();
    const int64_t n = self->configExchanges_++;  // on the queue: every rank counts alike
    auto key = [](int64_t k, int r) {
      return "set_config/" + std::to_string(k) + "/" + std::to_string(r);
    };
    self->store_->set(key(n, rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(key(n, r));
    try {
      self->store_->wait(keys, self->timeout_);
    } catch (const std::exception&) {
      std::string missing;
      for (int r = 0; r < size; ++r) {
        if (!self->store_->check({keys[size_t(r)]})) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
      }
      TORCH_CHECK(false, self->prefix(), "set_config: rank(s) ", missing,
                  " did not call qcomm.set_config for this group within its timeout (",
                  self->timeout_.count(),
                  " ms). It is collective: call it on every rank of the group, with the same "
                  "config, at the same point of their calls. This rank keeps its old config.");
    }
    for (int r = 0; r < size; ++r) {
      const std::vector<uint8_t> v = self->store_->get(keys[size_t(r)]);
      (*texts)[size_t(r)] = std::string(v.begin(), v.end());
    }
    // every rank has published its n-th: each read its (n-1)-th before, so this rank's can go
    if (n > 0) self->store_->deleteKey(key(n - 1, rank));
    work->complete();
  };
  queueCall(std::move(run), work, false);
  return *texts;
}

QuantConfig QncclBackend::getConfig() const {
  std::lock_guard<std::mutex> lock(configMutex_);
  return config_;
}

int64_t QncclBackend::releaseScratch() {
  std::lock_guard<std::mutex> lock(scratchMutex_);
  const int64_t held = scratch_.bytesHeld();
  scratch_.release();
  scratchHeld_ = scratch_.bytesHeld();
  return held;
}

std::map<std::string, ShadowStat> QncclBackend::shadowStats() const {
  std::lock_guard<std::mutex> lock(shadowMutex_);
  return shadow_;
}

void QncclBackend::resetStats() {
  {
    std::lock_guard<std::mutex> lock(shadowMutex_);
    shadow_.clear();
  }
  stats_.quantizedCalls = 0;
  stats_.passthroughCalls = 0;
  stats_.inputBytes = 0;
  stats_.wireBytes = 0;
  stats_.tunedClasses = 0;
  stats_.tuneNanos = 0;
  stats_.checkedClasses = 0;
  stats_.checkNanos = 0;
  stats_.retunedClasses = 0;
  for (CollectiveStats& c : stats_.sharded) {
    c.quantizedCalls = 0;
    c.passthroughCalls = 0;
    c.inputBytes = 0;
    c.wireBytes = 0;
  }
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

void QncclBackend::checkUsable(const char* op) const {
  std::lock_guard<std::mutex> lock(brokenMutex_);
  TORCH_CHECK(broken_.empty(), prefix(), op,
              ": this group cannot be used after an earlier quantized collective on it failed on "
              "the wire (",
              broken_, "); destroy it and create a new one");
}

void QncclBackend::breakWith(const std::string& why) {
  std::lock_guard<std::mutex> lock(brokenMutex_);
  if (broken_.empty()) broken_ = why.substr(0, why.find('\n'));
}

namespace {
std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& v : ts) out.insert(out.end(), v.begin(), v.end());
  return out;
}

std::string whatOf(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& x) {
    return x.what_without_backtrace();
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an unknown error";
  }
}
}  // namespace

c10::intrusive_ptr<c10d::Work> QncclBackend::forward(c10d::Backend* inner, const char* op,
                                                     c10d::OpType type,
                                                     std::vector<at::Tensor> outputs,
                                                     std::function<Issued(c10d::Backend*)> issue) {
  if (inner != gloo_.get() || queue_.idle() || queue_.onThread()) {
    Issued w = issue(inner);
    if (w) return w;
    return c10::make_intrusive<CompletedWork>(getRank(), std::move(outputs));
  }
  auto work = c10::make_intrusive<QueuedWork>(
      getRank(), type, internTitle(std::string("qnccl:") + op), std::vector<at::Tensor>{}, outputs);
  work->setQueue(queue_.identity());
  queue_.push(
      [inner, type, issue = std::move(issue), work] {
        Issued w = issue(inner);
        int source = -1;
        if (w) {
          w->wait();
          if (type == c10d::OpType::RECVANYSOURCE) source = w->sourceRank();
        }
        work->complete(source);
      },
      [work](const std::exception_ptr& e) { work->fail(e); });
  return work;
}

c10::intrusive_ptr<c10d::Work> QncclBackend::queueCall(std::function<void()> run,
                                                       const c10::intrusive_ptr<QueuedWork>& work,
                                                       bool asyncOp) {
  auto fail = [work](const std::exception_ptr& e) { work->fail(e); };
  if (queue_.onThread()) {
    // issued from a callback on the progress thread (a future's then): nothing else can run now
    try {
      run();
    } catch (...) {
      fail(std::current_exception());
    }
  } else {
    queue_.push(std::move(run), std::move(fail));
  }
  if (!asyncOp) work->wait();  // raises the call's error here, as the synchronous path did
  return work;
}

c10d::Backend* QncclBackend::pickAll(const std::vector<at::Tensor>& ts, const char* op) const {
  TORCH_CHECK(!ts.empty(), prefix(), op, ": no tensors given");
  checkUsable(op);
  refuseOverlap(ts, op);
  const_cast<Stats&>(stats_).passthroughCalls++;
  return pick(ts.front(), op);
}

CallFacts QncclBackend::factsOf(const at::Tensor& t, c10d::ReduceOp op) const {
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
  return f;
}

Plan QncclBackend::planFor(const at::Tensor& t, c10d::ReduceOp op, bool useTable,
                           const QuantConfig* config) const {
  const CallFacts f = factsOf(t, op);
  const QuantConfig cfg = config != nullptr ? *config : getConfig();
  Plan p;
  if (t.is_cuda() || !useTable) {
    // the tuner is for host memory: a CUDA allreduce with auto runs two_step
    p = makePlan(f, cfg);
    if (t.is_cuda()) p.tuneNeeded = false;
  } else {
    std::lock_guard<std::mutex> lock(tuningMutex_);
    p = makePlan(f, cfg, &tuning_);
  }
  if (disabled_) {
    p.quantize = false;
    p.tuneNeeded = false;
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
  if (!p.quantize) p.tuneNeeded = false;
  return p;
}

namespace {

constexpr int64_t kQuietCalls = 100;

}  // namespace

void QncclBackend::logDecision(const Plan& plan, const at::Tensor& t, c10d::ReduceOp op) {
  if (getRank() != 0 || settings::text("QCOMM_DEBUG") == "WARN") return;
  std::string what;
  if (plan.quantize) {
    auto bits = [](int b) { return b == 0 ? std::string("none") : std::to_string(b); };
    what = std::string("quantized with ") + algoName(plan.algorithm) + " " + bits(plan.rs.bits) +
           "/" + bits(plan.ag.bits) + ", groups of " + std::to_string(plan.rs.groupSize);
  } else {
    what = "passed through: " + plan.reason;
  }
  const std::string dtype = dtypeName(t.scalar_type());
  const std::string size = sizeClassName(t.numel() * int64_t(t.element_size()));
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

namespace {
// |q - e| over the elements whose exact value e is finite, in float64, a slice at a time (so the
// comparison never holds more than a few MiB of doubles): the squared norms and the largest |d|.
// A q that is not finite where e is counts as an infinite error.
void compareSlices(const at::Tensor& q, const at::Tensor& e, double* diff2, double* exact2,
                   double* maxAbs) {
  const at::Tensor qf = q.reshape({-1}), ef = e.reshape({-1});
  const int64_t n = qf.numel(), step = int64_t(1) << 20;
  for (int64_t b = 0; b < n; b += step) {
    const int64_t len = std::min(step, n - b);
    const at::Tensor ed = ef.narrow(0, b, len).to(at::kDouble);
    const at::Tensor finite = at::isfinite(ed);
    const at::Tensor d = (qf.narrow(0, b, len).to(at::kDouble) - ed).masked_fill(~finite, 0.0);
    const at::Tensor d2 = d.nan_to_num(INFINITY, INFINITY, INFINITY);
    *diff2 += (d2 * d2).sum().item<double>();
    *exact2 += (ed.masked_fill(~finite, 0.0).pow(2)).sum().item<double>();
    *maxAbs = std::max(*maxAbs, d2.abs().max().item<double>());
  }
}
}  // namespace

void QncclBackend::recordShadow(const Plan& plan, const at::Tensor& result, const at::Tensor& exact,
                                double exactSeconds, const std::string& collective) {
  const Clock::time_point start = Clock::now();
  double diff2 = 0, exact2 = 0, maxAbs = 0;
  if (result.numel() > 0) compareSlices(result, exact, &diff2, &exact2, &maxAbs);
  const double rel = exact2 > 0 ? std::sqrt(diff2 / exact2) : (diff2 > 0 ? double(INFINITY) : 0.0);
  const std::string key = (collective.empty() ? "" : collective + " ") +
                          dtypeName(result.scalar_type()) + " " +
                          sizeClassName(result.numel() * int64_t(result.element_size()));
  const double took = exactSeconds + std::chrono::duration<double>(Clock::now() - start).count();
  std::lock_guard<std::mutex> lock(shadowMutex_);
  ShadowStat& s = shadow_[key];
  s.calls++;
  s.relL2Sum += rel;
  s.relL2Max = std::max(s.relL2Max, rel);
  s.maxAbs = std::max(s.maxAbs, maxAbs);
  s.seconds += took;
  (void)plan;
}

c10::intrusive_ptr<c10d::Work> QncclBackend::passThroughAllreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return forward(pickAll(tensors, "allreduce"), "all_reduce", c10d::OpType::ALLREDUCE, tensors,
                 [=](c10d::Backend* b) mutable { return b->allreduce(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(!tensors.empty(), prefix(), "allreduce: no tensors given");
  if (tensors.size() != 1) return passThroughAllreduce(tensors, opts);
  at::Tensor& t = tensors[0];
  TORCH_CHECK(!shutDown_, prefix(), "allreduce: the process group has been shut down");
  TORCH_CHECK_VALUE(t.device().is_cpu() || t.is_cuda(), prefix(), "allreduce: tensors on ",
                    t.device(), " are not supported; qnccl takes CPU and CUDA tensors");
  refuseOverlap(tensors, "allreduce");
  // the result is written into the caller's tensor as Gloo and NCCL write it, outside autograd
  // (a non-contiguous view of a leaf that requires grad gets its result copied back too)
  const at::NoGradGuard noGrad;
  // the config of the call's issue: a queued call is planned with it, not with one set since
  const QuantConfig cfg = getConfig();
  Plan plan = planFor(t, opts.reduceOp, true, &cfg);
  // auto with tune, host memory: what the table says is read on the progress thread, where every
  // rank reaches this call at the same point of the same sequence (a measurement, a check or a
  // re-tune of the class ran before it, or not, alike on every rank); at issue time a rank may
  // or may not yet see the choice of an earlier call's measurement
  const Plan untuned = planFor(t, opts.reduceOp, false, &cfg);
  const bool tunedOnQueue =
      !t.is_cuda() && untuned.quantize && cfg.algorithm == kAuto && cfg.tune && !disabled_;
  if (tunedOnQueue) {
    plan = untuned;
    plan.tuneNeeded = true;
  }
  // a class still to be measured is logged once its measurement has decided
  if (!tunedOnQueue) logDecision(plan, t, opts.reduceOp);
  if (!plan.quantize) return passThroughAllreduce(tensors, opts);
#ifdef QCOMM_WITH_CUDA
  if (t.is_cuda()) return allreduceCuda(plan, tensors, opts);
#endif
  checkUsable("allreduce");
  // counted for every call the config quantizes, a class tuned to exact too: the number is a
  // function of the calls issued, not of when this rank read the table
  plan.callSeq = callSeq_++;
  auto bits = [](int b) { return b == 0 ? std::string("-") : std::to_string(b); };
  const std::string algo = plan.tuneNeeded ? "auto" : algoName(plan.algorithm);
  const char* title =
      internTitle(std::string("qnccl:all_reduce ") + algo + " " + bits(plan.rs.bits) + "/" +
                  bits(plan.ag.bits) + " g" + std::to_string(plan.rs.groupSize));
  auto work =
      c10::make_intrusive<QueuedWork>(getRank(), c10d::OpType::ALLREDUCE, title, tensors, tensors);
  work->setQueue(queue_.identity());
  // the task holds the backend, so that a group dropped with calls queued lives until they ran
  auto self = c10::intrusive_ptr<QncclBackend>::reclaim_copy(this);
  const std::chrono::milliseconds timeout = callTimeout(opts);
  auto run = [self, plan, t, timeout, work, opts, cfg]() mutable {
    if (plan.tuneNeeded) {
      // every rank reaches this call of this class in the same order: the measurement, check or
      // re-tune is collective; then the call takes the plan the table now gives
      self->settleClass(plan, t, timeout);
      const uint32_t seq = plan.callSeq;
      plan = self->planFor(t, opts.reduceOp, true, &cfg);
      plan.callSeq = seq;
      self->logDecision(plan, t, opts.reduceOp);
      const Clock::time_point start = Clock::now();
      if (!plan.quantize) {
        self->exactOnQueue(t, opts);
      } else {
        self->runQueued(plan, t, timeout);
      }
      const int64_t bytes = t.numel() * int64_t(t.element_size());
      self->noteCallTime(plan.userDtype, sizeClassOf(bytes),
                         std::chrono::duration<double>(Clock::now() - start).count());
      work->complete();
      return;
    }
    self->runQueued(plan, t, timeout);
    work->complete();
  };
  return queueCall(std::move(run), work, opts.asyncOp);
}

void QncclBackend::runQueued(const Plan& plan, at::Tensor& tensor,
                             std::chrono::milliseconds timeout) {
  const at::NoGradGuard noGrad;  // grad mode is per thread: the copy-back stays out of autograd
  checkUsable("allreduce");
  useCodecThreads();
  std::string mismatch;
  guardTransport([&] { mismatch = runQuantizedCpu(plan, tensor, timeout); });
  // every rank saw the same headers and raises here, so the group stays usable
  requireAgreement(mismatch);
}

void QncclBackend::useCodecThreads() {
  // the codec's threads (at::parallel_for), this thread's alone: torch's count elsewhere is not
  // touched
  at::internal::lazy_init_num_threads();
  if (cpuThreads_ > 0 && at::get_num_threads() != cpuThreads_) omp_set_num_threads(cpuThreads_);
  cpuThreadsUsed_ = at::get_num_threads();
}

void QncclBackend::guardTransport(const std::function<void()>& body) {
  try {
    body();
  } catch (const c10::Error& e) {
    breakWith(e.what_without_backtrace());  // a transport failure: the peers' state is unknown
    throw;
  } catch (const std::exception& e) {
    breakWith(e.what());
    throw;
  }
}

void QncclBackend::requireAgreement(const std::string& mismatch) const {
  TORCH_CHECK(mismatch.empty(), prefix(), "allreduce: the ranks disagree on this call: ", mismatch,
              ". Every rank must pass the same numel, dtype and op, and hold the same QuantConfig "
              "(qcomm.set_config on every rank).");
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

std::string QncclBackend::runQuantizedCpu(const Plan& plan, at::Tensor& tensor,
                                          std::chrono::milliseconds timeout, bool count) {
  C10dTransport transport(gloo_.get(), getRank(), getSize(), timeout, C10dTransport::kPointToPoint);
  const std::string mismatch = agreeOnPlan(plan, transport);
  if (!mismatch.empty()) return mismatch;
  CpuCodecOps ops;
  std::lock_guard<std::mutex> lock(scratchMutex_);
  // shadow mode: the exact allreduce of a copy first (every rank shadows the same calls: the
  // plan's header carries the setting and callSeq is counted alike)
  const bool shadowed = count && plan.shadowed();
  const Clock::time_point shadowStart = Clock::now();
  at::Tensor exact;
  if (shadowed) {
    exact = tensor.contiguous().clone();
    std::vector<at::Tensor> ts{exact};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = timeout;
    o.asyncOp = true;
    gloo_->allreduce(ts, o)->wait();
    if (plan.average) exact.div_(getSize());
  }
  const double shadowSeconds = std::chrono::duration<double>(Clock::now() - shadowStart).count();
  scratch_.begin();
  // the message the schedule runs on (staging.h): the tensor itself, or its contiguous copy, or
  // (a rotated message that ends inside a group) its copy padded with zeros to whole groups in
  // the group's kept buffers; the result is copied back in place
  at::Tensor storage;
  if (needsPadding(plan)) {
    const int64_t bytes = plan.numel * int64_t(tensor.element_size());
    storage = scratch_.take(bytes, tensor.options()).view(tensor.scalar_type());
  }
  Staged msg(plan, tensor, storage);
  runAllreduce(plan, transport, ops, msg.data(), &scratch_);
  msg.finish();
  scratchHeld_ = scratch_.bytesHeld();
  if (shadowed) recordShadow(plan, tensor, exact, shadowSeconds);
  if (!count) return "";
  stats_.quantizedCalls++;
  stats_.inputBytes += tensor.numel() * tensor.element_size();
  stats_.wireBytes += transport.bytesSent();
  return "";
}

std::string QncclBackend::agreeOnPlan(const Plan& plan, C10dTransport& t) {
  const PlanHeader mine = headerOf(plan);
  at::Tensor send = at::empty({int64_t(sizeof(PlanHeader))}, at::kByte);
  at::Tensor recv = at::empty({int64_t(sizeof(PlanHeader)) * getSize()}, at::kByte);
  std::memcpy(send.data_ptr(), &mine, sizeof(PlanHeader));
  t.allGatherNow(recv, send, "exchange of the call's header (numel, dtype, op, config)");
  std::vector<PlanHeader> all(static_cast<size_t>(getSize()));
  std::memcpy(all.data(), recv.data_ptr(), sizeof(PlanHeader) * all.size());
  return describeMismatch(all);
}

std::string QncclBackend::agreeHere(const Plan& plan, std::chrono::milliseconds timeout) {
  C10dTransport control(gloo_.get(), getRank(), getSize(), timeout, C10dTransport::kPointToPoint);
  return agreeOnPlan(plan, control);
}

std::string QncclBackend::agreeOnQueue(const Plan& plan, std::chrono::milliseconds timeout) {
  auto agree = [this, &plan, timeout]() { return agreeHere(plan, timeout); };
  if (queue_.onThread()) return agree();
  auto result = std::make_shared<std::promise<std::string>>();
  std::future<std::string> done = result->get_future();
  // the caller waits below, so the task's references to plan stay valid
  queue_.push([result, agree]() { result->set_value(agree()); },
              [result](const std::exception_ptr& e) { result->set_exception(e); });
  return done.get();
}

void QncclBackend::agreeOnCudaCall(const Plan& plan, std::chrono::milliseconds timeout) {
  requireAgreement(agreeOnQueue(plan, timeout));
}

// ---- pass-through ----

c10::intrusive_ptr<c10d::Work> QncclBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  return forward(pickAll(tensors, "broadcast"), "broadcast", c10d::OpType::BROADCAST, tensors,
                 [=](c10d::Backend* b) mutable { return b->broadcast(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  return forward(pickAll(tensors, "allreduce_sparse"), "allreduce_sparse",
                 c10d::OpType::_ALLREDUCE_SPARSE, tensors,
                 [=](c10d::Backend* b) mutable { return b->allreduce_sparse(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return forward(pickAll(tensors, "allreduce_coalesced"), "allreduce_coalesced",
                 c10d::OpType::ALLREDUCE_COALESCED, tensors,
                 [=](c10d::Backend* b) mutable { return b->allreduce_coalesced(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::reduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::ReduceOptions& opts) {
  return forward(pickAll(tensors, "reduce"), "reduce", c10d::OpType::REDUCE, tensors,
                 [=](c10d::Backend* b) mutable { return b->reduce(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  refuseOverlap(outputs, "allgather_coalesced");
  return forward(pickAll(inputs, "allgather_coalesced"), "allgather_coalesced",
                 c10d::OpType::ALLGATHER_COALESCED, flat(outputs), [=](c10d::Backend* b) mutable {
                   return b->allgather_coalesced(outputs, inputs, opts);
                 });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  refuseOverlap(outputs, "allgather_into_tensor_coalesced");
  return forward(pickAll(inputs, "allgather_into_tensor_coalesced"),
                 "allgather_into_tensor_coalesced", c10d::OpType::COALESCED, outputs,
                 [=](c10d::Backend* b) mutable {
                   return b->allgather_into_tensor_coalesced(outputs, inputs, opts);
                 });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::GatherOptions& opts) {
  refuseOverlap(outputs, "gather");
  return forward(pickAll(inputs, "gather"), "gather", c10d::OpType::GATHER, flat(outputs),
                 [=](c10d::Backend* b) mutable { return b->gather(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  refuseOverlap(inputs, "scatter");
  return forward(pickAll(outputs, "scatter"), "scatter", c10d::OpType::SCATTER, outputs,
                 [=](c10d::Backend* b) mutable { return b->scatter(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  refuseOverlap(outputs, "reduce_scatter_tensor_coalesced");
  return forward(pickAll(inputs, "reduce_scatter_tensor_coalesced"),
                 "reduce_scatter_tensor_coalesced", c10d::OpType::COALESCED, outputs,
                 [=](c10d::Backend* b) mutable {
                   return b->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
                 });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& outputSplits,
                                                           std::vector<int64_t>& inputSplits,
                                                           const c10d::AllToAllOptions& opts) {
  refuseOverlap({output}, "all_to_all_single");
  return forward(pickAll({input}, "all_to_all_single"), "all_to_all_single",
                 c10d::OpType::ALLTOALL_BASE, {output}, [=](c10d::Backend* b) mutable {
                   return b->alltoall_base(output, input, outputSplits, inputSplits, opts);
                 });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  refuseOverlap(outputs, "all_to_all");
  return forward(pickAll(inputs, "all_to_all"), "all_to_all", c10d::OpType::ALLTOALL, outputs,
                 [=](c10d::Backend* b) mutable { return b->alltoall(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::send(std::vector<at::Tensor>& tensors, int dstRank,
                                                  int tag) {
  return forward(pickAll(tensors, "send"), "send", c10d::OpType::SEND, {},
                 [=](c10d::Backend* b) mutable { return b->send(tensors, dstRank, tag); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::recv(std::vector<at::Tensor>& tensors, int srcRank,
                                                  int tag) {
  return forward(pickAll(tensors, "recv"), "recv", c10d::OpType::RECV, tensors,
                 [=](c10d::Backend* b) mutable { return b->recv(tensors, srcRank, tag); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                           int tag) {
  return forward(pickAll(tensors, "recv_anysource"), "recv_anysource", c10d::OpType::RECVANYSOURCE,
                 tensors, [=](c10d::Backend* b) mutable { return b->recvAnysource(tensors, tag); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::barrier(const c10d::BarrierOptions& opts) {
  TORCH_CHECK(!shutDown_, prefix(), "barrier: the process group has been shut down");
  stats_.passthroughCalls++;
  const bool cuda = (opts.device.has_value() && opts.device->is_cuda()) || !opts.device_ids.empty();
  if (cuda && nccl_) return nccl_->barrier(opts);
  checkUsable("barrier");
  return forward(gloo_.get(), "barrier", c10d::OpType::BARRIER, {},
                 [=](c10d::Backend* b) mutable { return b->barrier(opts); });
}

void QncclBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  TORCH_CHECK(!shutDown_, prefix(), "monitored_barrier: the process group has been shut down");
  checkUsable("monitored_barrier");
  stats_.passthroughCalls++;
  forward(gloo_.get(), "monitored_barrier", c10d::OpType::BARRIER, {}, [=](c10d::Backend* b) {
    b->monitoredBarrier(opts, waitAllRanks);
    return c10::intrusive_ptr<c10d::Work>();
  })->wait();
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
  // calls still queued run first, within the group's timeout; those that could not start by
  // then fail (each running one is bounded by its own timeout)
  queue_.stop(timeout_, prefix() +
                            "the group was destroyed before this collective could start (it was "
                            "still queued after the group's timeout)");
  if (nccl_) nccl_->shutdown();
  gloo_->shutdown();
}

void QncclBackend::abort() {
  if (shutDown_.exchange(true)) return;
  queue_.stop(std::chrono::milliseconds(0),
              prefix() + "the group was aborted before this collective could start");
  if (nccl_) nccl_->abort();
  gloo_->abort();
}

}  // namespace qcomm
