// The tuner (plan/tuning.h): on the group's progress thread, at the first eligible allreduce of
// a dtype and size class (QuantConfig.tune) or when qcomm.tune asks, every rank times the exact
// inner allreduce and each quantized candidate on copies of the same message, interleaved; the
// times agreed (the maximum over ranks) decide, rank 0 broadcasts the choice, and every rank
// enters it in its table. Rank 0 then writes the table to the cache file qcomm named.
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "backend/backend.h"
#include "backend/work.h"
#include "common/errors.h"
#include "common/settings.h"
#include "transport/c10d_transport.h"

namespace qcomm {
namespace {

// Timed rounds after the first runs (which fault pages in), one run of each kept candidate a
// round: as many as fit in about kBudget seconds of first-run times, from kMinRuns to kMaxRuns,
// so that small classes, where a shared machine's noise is largest, get the most samples. (A
// budget of 0.1 s of the exact allreduce alone gave only 3 runs at 4 MiB over 1 Gbit/s.)
constexpr int kMinRuns = 3, kMaxRuns = 15;
constexpr double kBudget = 0.5;
constexpr double kMargin = 0.05;   // a quantized choice must be this much faster than exact
constexpr double kDropFactor = 2;  // slower than this x the fastest after one run: dropped

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? -1 : v[v.size() / 2];
}

const char* dtypeText(int32_t d) {
  return d == kFloat32 ? "float32" : d == kFloat16 ? "float16" : "bfloat16";
}

std::string jsonNumber(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.6g", v);
  return b;
}

}  // namespace

std::vector<TuneEntry> QncclBackend::tuningEntries(bool cuda) const {
  std::lock_guard<std::mutex> lock(tuningMutex_);
  return cuda ? tuningCuda_.entries() : tuning_.entries();
}

void QncclBackend::loadTuning(const std::vector<TuneEntry>& entries) {
  std::lock_guard<std::mutex> lock(tuningMutex_);
  for (const TuneEntry& e : entries) tuning_.put(e);
}

void QncclBackend::setTuningCache(const std::string& path, const std::string& keyJson) {
  std::lock_guard<std::mutex> lock(tuningMutex_);
  tuneFile_ = path;
  tuneKey_ = keyJson;
}

std::string QncclBackend::tuningCachePath() const {
  std::lock_guard<std::mutex> lock(tuningMutex_);
  return tuneFile_;
}

void QncclBackend::setTuneTimingFactors(std::vector<double> factors) {
  std::lock_guard<std::mutex> lock(tuningMutex_);
  tuneTimingFactors_ = std::move(factors);
}

void QncclBackend::tune(const at::Tensor& sample) {
  TORCH_CHECK(!shutDown_, prefix(), "tune: the process group has been shut down");
  checkUsable("tune");
  TORCH_CHECK_VALUE(sample.device().is_cpu() || sample.is_cuda(), prefix(), "tune: tensors on ",
                    sample.device(), " are not supported");
  TORCH_CHECK_VALUE(!disabled_, prefix(), "tune: QCOMM_DISABLE=1: every allreduce passes through");
  const QuantConfig cfg = getConfig();
  TORCH_CHECK_VALUE(cfg.algorithm == kAuto, prefix(), "tune: the group's algorithm is ",
                    algoName(cfg.algorithm),
                    ", chosen explicitly; the tuner chooses only for algorithm='auto'");
  Plan plan = makePlan(factsOf(sample, c10d::ReduceOp::SUM), cfg);
  TORCH_CHECK_VALUE(plan.quantize, prefix(), "tune: an allreduce of ", sample.numel(), " ",
                    sample.scalar_type(), " elements passes through (", plan.reason,
                    "); there is nothing to tune");
  if (sample.is_cuda()) {
    TORCH_CHECK_VALUE(plan.quantize && settings::flag("QCOMM_CUDA_QUANTIZE"), prefix(),
                      "tune: quantizing CUDA allreduces is opt-in (QCOMM_CUDA_QUANTIZE=1)");
    measureClass(plan, sample.detach(), timeout_, false);  // on the caller's stream
    return;
  }
  auto work = c10::make_intrusive<QueuedWork>(getRank(), c10d::OpType::ALLREDUCE, "qnccl:tune",
                                              std::vector<at::Tensor>{}, std::vector<at::Tensor>{});
  auto self = c10::intrusive_ptr<QncclBackend>::reclaim_copy(this);
  at::Tensor copy = sample.detach();
  queue_.push(
      [self, plan, copy, work] {
        self->measureClass(plan, copy, self->timeout_, false);
        work->complete();
      },
      [work](const std::exception_ptr& e) { work->fail(e); });
  work->wait();
}

void QncclBackend::exactOnQueue(at::Tensor& t, const c10d::AllreduceOptions& opts) {
  stats_.passthroughCalls++;
  std::vector<at::Tensor> ts{t};
  c10d::AllreduceOptions o = opts;
  o.asyncOp = true;
  gloo_->allreduce(ts, o)->wait();
}

void QncclBackend::measureClass(const Plan& plan, const at::Tensor& sample,
                                std::chrono::milliseconds timeout, bool onlyIfMissing) {
  const int32_t dtype = plan.userDtype;
  const int64_t bytes = sample.numel() * int64_t(sample.element_size());
  const int32_t cls = sizeClassOf(bytes);
  const bool cuda = sample.is_cuda();
  TuningTable& table = cuda ? tuningCuda_ : tuning_;
  if (onlyIfMissing) {
    std::lock_guard<std::mutex> lock(tuningMutex_);
    if (table.find(dtype, cls) != nullptr) return;  // an earlier call of the class measured it
  }
  const Clock::time_point start = Clock::now();
  if (!cuda) useCodecThreads();
  const std::vector<TuneChoice> cands = tuneCandidates(getSize(), cuda);
  const size_t n = cands.size();
  std::vector<double> factors;
  {
    std::lock_guard<std::mutex> lock(tuningMutex_);
    factors = tuneTimingFactors_;
  }
  QuantConfig cfg = getConfig();
  const CallFacts facts = factsOf(sample, c10d::ReduceOp::SUM);
  const at::Tensor data = sample.contiguous().clone();
  at::Tensor work = at::empty_like(data);
  c10d::AllreduceOptions opts;
  opts.timeout = timeout;

  // the numbers of every rank, their maximum on every rank
  auto agreed = [&](std::vector<double> v) {
    std::vector<at::Tensor> ts{at::tensor(v, at::kDouble)};
    c10d::AllreduceOptions o = opts;
    o.reduceOp = c10d::ReduceOp::MAX;
    gloo_->allreduce(ts, o)->wait();
    std::copy_n(ts[0].data_ptr<double>(), v.size(), v.begin());
    return v;
  };
  auto runOnce = [&](size_t i) {
    work.copy_(data);
    Plan candidate;
    if (!cands[i].exact()) {
      cfg.algorithm = cands[i].algorithm;
      cfg.microshards = cands[i].microshards;
      candidate = quantizedPlan(facts, cfg);
    }
#ifdef QCOMM_WITH_CUDA
    if (cuda) {
      cudaSync(work);  // the copy is not timed
      const Clock::time_point t0 = Clock::now();
      cudaTuneRun(cands[i].exact() ? nullptr : &candidate, work, opts);
      return secondsSince(t0) * (i < factors.size() ? factors[i] : 1.0);
    }
#endif
    // every rank starts the run together, as calls separated by other work do: back to back, a
    // rank done first would time its wait for the others, and a link's queue left by the run
    // before, as this run's
    c10d::BarrierOptions b;
    b.timeout = timeout;
    gloo_->barrier(b)->wait();
    const Clock::time_point t0 = Clock::now();
    if (cands[i].exact()) {
      std::vector<at::Tensor> ts{work};
      gloo_->allreduce(ts, opts)->wait();
    } else {
      requireAgreement(runQuantizedCpu(candidate, work, timeout, false));
    }
    return secondsSince(t0) * (i < factors.size() ? factors[i] : 1.0);
  };

  // every rank measures the same class: the call's header first (a mismatch raises on every
  // rank alike and leaves the group usable)
  std::string mismatch;
  guardTransport([&] {
    C10dTransport transport(gloo_.get(), getRank(), getSize(), timeout,
                            C10dTransport::kPointToPoint);
    mismatch = agreeOnPlan(plan, transport);
  });
  requireAgreement(mismatch);
  std::vector<double> first(n), med(n, -1.0);
  std::vector<bool> keep(n, true);
  guardTransport([&] {
    for (size_t i = 0; i < n; ++i) first[i] = runOnce(i);
    first = agreed(first);
    keep = tuneKeep(first, kDropFactor, kBudget, kMinRuns);
    // from the agreed times: every rank runs the same number
    const int timed = tuneRounds(first, keep, kBudget, kMinRuns, kMaxRuns);
    std::vector<std::vector<double>> runs(n);
    for (int r = 0; r < timed; ++r) {
      for (size_t i : tuneRoundOrder(n, r)) {
        if (keep[i]) runs[i].push_back(runOnce(i));
      }
    }
    for (size_t i = 0; i < n; ++i) med[i] = keep[i] ? median(runs[i]) : -1.0;
    med = agreed(med);
    // one rank decides, every rank takes its choice (identical inputs already; this makes the
    // table a shared fact whatever the arithmetic)
    std::vector<at::Tensor> pick{at::full({1}, int64_t(decideTuning(med, kMargin)), at::kLong)};
    c10d::BroadcastOptions b;
    b.rootRank = 0;
    b.timeout = timeout;
    gloo_->broadcast(pick, b)->wait();
    const int64_t chosen = pick[0].item<int64_t>();
    TORCH_CHECK(chosen >= 0 && size_t(chosen) < n, prefix(), "tune: rank 0 chose candidate ",
                chosen, " of ", n);
    TuneEntry e;
    e.dtype = dtype;
    e.sizeClass = cls;
    e.bytes = bytes;
    e.choice = cands[size_t(chosen)];
    for (size_t i = 0; i < n; ++i)
      e.seconds.emplace_back(cands[i], med[i] >= 0 ? med[i] : first[i]);
    std::lock_guard<std::mutex> lock(tuningMutex_);
    table.put(e);
  });
  const double took = secondsSince(start);
  stats_.tunedClasses++;
  stats_.tuneNanos += int64_t(took * 1e9);
  if (getRank() != 0) return;
  if (!cuda) saveTuning();  // the cache holds host-memory choices only
  if (settings::text("QCOMM_DEBUG") == "WARN") return;
  const TuneEntry* e = nullptr;
  std::string times;
  {
    std::lock_guard<std::mutex> lock(tuningMutex_);
    e = table.find(dtype, cls);
    for (size_t i = 0; i < e->seconds.size(); ++i) {
      const auto& kv = e->seconds[i];
      times += (times.empty() ? "" : ", ") + choiceName(kv.first) + " " +
               jsonNumber(kv.second * 1e3) + " ms" +
               (i < keep.size() && !keep[i] ? " (one run, dropped)" : "");
    }
    std::fprintf(stderr,
                 "%sINFO tuned %s allreduces of %s, class 2^%d bytes (measured at %lld B, "
                 "%.2f s): %s (%s)\n",
                 prefix().c_str(), cuda ? "CUDA" : "host-memory", dtypeText(dtype), int(cls),
                 static_cast<long long>(bytes), took, choiceName(e->choice).c_str(), times.c_str());
  }
}

void QncclBackend::saveTuning() const {
  std::string path, key;
  std::vector<TuneEntry> entries;
  {
    std::lock_guard<std::mutex> lock(tuningMutex_);
    path = tuneFile_;
    key = tuneKey_;
    entries = tuning_.entries();
  }
  if (path.empty()) return;
  std::string out = "{\"format\": 1,\n \"key\": " + key + ",\n \"entries\": [";
  for (size_t i = 0; i < entries.size(); ++i) {
    const TuneEntry& e = entries[i];
    out += std::string(i ? ",\n  " : "\n  ") + "{\"dtype\": \"" + dtypeText(e.dtype) +
           "\", \"size_class\": " + std::to_string(e.sizeClass) +
           ", \"bytes\": " + std::to_string(e.bytes) + ", \"algorithm\": \"" +
           algoName(e.choice.algorithm) +
           "\", \"microshards\": " + std::to_string(e.choice.microshards) + ", \"seconds\": {";
    for (size_t j = 0; j < e.seconds.size(); ++j) {
      out += std::string(j ? ", " : "") + "\"" + choiceName(e.seconds[j].first) +
             "\": " + jsonNumber(e.seconds[j].second);
    }
    out += "}}";
  }
  out += "\n ]}\n";
  // written whole, then renamed over the old file: a reader never sees half a table
  const std::string tmp = path + ".tmp";
  std::ofstream f(tmp, std::ios::trunc);
  f << out;
  f.close();
  if (!f || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "%sWARN could not write the tuning cache %s; the choices stay in memory\n",
                 prefix().c_str(), path.c_str());
  }
}

}  // namespace qcomm
