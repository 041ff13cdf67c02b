// The tuner (plan/tuning.h), for host-memory allreduces, reduce-scatters and all-gathers: on the
// group's progress thread, at the first eligible call of a collective, dtype and size class
// (QuantConfig.tune) or when qcomm.tune asks, every rank times the exact inner collective and
// each quantized candidate on copies of the same message, interleaved; the times agreed (the
// maximum over ranks) decide, rank 0 broadcasts the choice, and every rank enters it in its table.
// Rank 0 then writes the table to the cache file qcomm named. An entry loaded from that cache is
// checked at the first call of its class (a few paired runs of exact and the cached choice) before
// it is relied on; and every so many calls of a class the ranks compare their real calls' durations
// with the tuned time, re-tuning the class when they drifted (all of it at a call every rank
// reaches at the same point).
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "backend/backend.h"
#include "backend/tuning_cache.h"
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
// The check of a cached entry: an untimed run each, then kCheckRounds runs of exact and of the
// cached choice (or, where it is exact, of the entry's fastest quantized candidate), alternating
// which goes first; it
// disagrees when the fastest runs (the least disturbed by a shared machine's noise; maximum over
// ranks) put the other one ahead by more than kCheckNoise.
constexpr int kCheckRounds = 2;
constexpr double kCheckNoise = 0.10;
// Drift: every kDriftFirst calls of a tuned class (the interval doubling after each re-tune, up
// to kDriftMaxInterval) the ranks compare the median duration of the class's real calls since the
// last comparison with the time tuning measured for its choice; beyond kDriftBound times slower
// or faster on any rank, every rank re-tunes the class. kDriftMinCalls durations at least.
constexpr int64_t kDriftFirst = 32, kDriftMaxInterval = 1 << 16, kDriftMinCalls = 8;
constexpr double kDriftBound = 2.0;

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? -1 : v[v.size() / 2];
}

// What the log lines call the calls of a collective.
std::string callsOf(int32_t collective) {
  return collective == kAllreduce ? "allreduces" : std::string(collectiveName(collective)) + "s";
}

// The message the tuner times a class on: a copy of the sample; an all-gather's output holds no
// data before the call, so a fixed ramp of its size instead (values shape no timing but NaN's).
// Flat: a reduce-scatter's exact run pairs it with a flat shard, which Gloo refuses for a 2-D
// input (its first dimension must be W times the output's).
at::Tensor tuneData(const at::Tensor& sample, int32_t collective) {
  if (collective != kAllGather) return sample.contiguous().clone().reshape({-1});
  return at::sin(at::arange(sample.numel(), sample.options().dtype(at::kFloat)))
      .to(sample.scalar_type());
}

// The facts the candidates' plans are made from: the sample's, as a message of `collective`.
CallFacts tuneFacts(CallFacts f, int32_t collective) {
  f.collective = collective;
  f.shapeOk = true;
  f.opSum = true;
  f.opAvg = false;
  return f;
}

// Every rank starts the next timed run together: a one-element allreduce over Gloo, not Gloo's
// barrier, which also waits for (and rethrows the errors of) every Gloo work issued before it: a
// pass-through call whose callback waits for the quantized call being tuned here would never end.
void startTogether(c10d::Backend& gloo, std::chrono::milliseconds timeout) {
  std::vector<at::Tensor> ts{at::zeros({1}, at::kFloat)};
  c10d::AllreduceOptions o;
  o.timeout = timeout;
  gloo.allreduce(ts, o)->wait();
}

}  // namespace

std::vector<TuneEntry> QncclBackend::tuningEntries() const {
  std::lock_guard<std::mutex> lock(tuningMutex_);
  return tuning_.entries();
}

void QncclBackend::loadTuning(const std::vector<TuneEntry>& entries) {
  std::lock_guard<std::mutex> lock(tuningMutex_);
  for (TuneEntry e : entries) {
    e.verified = false;  // checked at the first call of its class (checkClass)
    tuning_.put(e);
  }
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

void QncclBackend::tune(const at::Tensor& sample, int32_t collective) {
  TORCH_CHECK(!shutDown_, prefix(), "tune: the process group has been shut down");
  checkUsable("tune");
  TORCH_CHECK_VALUE(sample.device().is_cpu(), prefix(), "tune: the tuner measures host-memory ",
                    "allreduces only; a CUDA allreduce with algorithm='auto' runs two_step (got a "
                    "tensor on ",
                    sample.device(), ")");
  TORCH_CHECK_VALUE(!disabled_, prefix(), "tune: QCOMM_DISABLE=1: every allreduce passes through");
  const QuantConfig cfg = getConfig();
  TORCH_CHECK_VALUE(cfg.algorithm == kAuto, prefix(), "tune: the group's algorithm is ",
                    algoName(cfg.algorithm),
                    ", chosen explicitly; the tuner chooses only for algorithm='auto'");
  TORCH_CHECK_VALUE(collective >= kAllreduce && collective <= kAllGather, prefix(),
                    "tune: unknown collective ", collective);
  Plan plan;
  if (collective == kAllreduce) {
    plan = makePlan(factsOf(sample, c10d::ReduceOp::SUM), cfg);
  } else {
    const int64_t n = sample.numel() / getSize();
    TORCH_CHECK_VALUE(n * getSize() == sample.numel(), prefix(), "tune: a ",
                      collectiveName(collective), " message of ", sample.numel(),
                      " elements is not ", getSize(), " shards alike");
    plan = planForSharded(collective, sample, sample.reshape({-1}).narrow(0, 0, n),
                          c10d::ReduceOp::SUM, true, false);
  }
  TORCH_CHECK_VALUE(plan.quantize, prefix(), "tune: ",
                    collective == kAllreduce ? std::string("an allreduce")
                                             : std::string("a ") + collectiveName(collective),
                    " of ", sample.numel(), " ", sample.scalar_type(), " elements passes through (",
                    plan.reason, "); there is nothing to tune");
  auto work = c10::make_intrusive<QueuedWork>(getRank(), c10d::OpType::ALLREDUCE, "qnccl:tune",
                                              std::vector<at::Tensor>{}, std::vector<at::Tensor>{});
  work->setQueue(queue_.identity());
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
  const int32_t dtype = plan.userDtype, coll = plan.collective;
  const int64_t bytes = sample.numel() * int64_t(sample.element_size());
  const int32_t cls = sizeClassOf(bytes);
  TuningTable& table = tuning_;
  if (onlyIfMissing) {
    std::lock_guard<std::mutex> lock(tuningMutex_);
    if (table.find(dtype, cls, coll) != nullptr) return;  // an earlier call measured the class
  }
  const Clock::time_point start = Clock::now();
  useCodecThreads();
  const std::vector<TuneChoice> cands = tuneCandidates(getSize(), false, coll);
  const size_t n = cands.size();
  std::vector<double> factors;
  {
    std::lock_guard<std::mutex> lock(tuningMutex_);
    factors = tuneTimingFactors_;
  }
  QuantConfig cfg = getConfig();
  const CallFacts facts = tuneFacts(factsOf(sample, c10d::ReduceOp::SUM), coll);
  const at::Tensor data = tuneData(sample, coll);
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
    // every rank starts the run together, as calls separated by other work do: back to back, a
    // rank done first would time its wait for the others, and a link's queue left by the run
    // before, as this run's
    startTogether(*gloo_, timeout);
    const Clock::time_point t0 = Clock::now();
    runForTuning(candidate, coll, work, timeout);
    return secondsSince(t0) * (i < factors.size() ? factors[i] : 1.0);
  };

  // every rank measures the same class: the call's header first (a mismatch raises on every
  // rank alike and leaves the group usable)
  std::string mismatch;
  guardTransport([&] { mismatch = agreeHere(plan, timeout); });
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
    e.collective = coll;
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
  saveTuning();
  if (settings::text("QCOMM_DEBUG") == "WARN") return;
  const TuneEntry* e = nullptr;
  std::string times;
  {
    std::lock_guard<std::mutex> lock(tuningMutex_);
    e = table.find(dtype, cls, coll);
    for (size_t i = 0; i < e->seconds.size(); ++i) {
      const auto& kv = e->seconds[i];
      times += (times.empty() ? "" : ", ") + choiceName(kv.first) + " " +
               jsonNumber(kv.second * 1e3) + " ms" +
               (i < keep.size() && !keep[i] ? " (one run, dropped)" : "");
    }
    std::fprintf(stderr,
                 "%sINFO tuned host-memory %s of %s, class 2^%d bytes (measured at %lld "
                 "B, %.2f s): %s (%s)\n",
                 prefix().c_str(), callsOf(coll).c_str(), dtypeText(dtype), int(cls),
                 static_cast<long long>(bytes), took, choiceName(e->choice).c_str(), times.c_str());
  }
}

void QncclBackend::runForTuning(const Plan& candidate, int32_t collective, at::Tensor& work,
                                std::chrono::milliseconds timeout) {
  if (collective == kAllreduce) {
    if (candidate.quantize) {
      requireAgreement(runQuantizedCpu(candidate, work, timeout, false));
      return;
    }
    c10d::AllreduceOptions o;
    o.timeout = timeout;
    std::vector<at::Tensor> ts{work};
    gloo_->allreduce(ts, o)->wait();
    return;
  }
  // work is the message (the reduce-scatter's input, the all-gather's output); the all-gather's
  // input is this rank's slot of it, in place (FSDP2's)
  const int64_t n = work.numel() / getSize();
  ShardedCall call;
  call.collective = collective;
  call.name = collective == kReduceScatter ? "reduce_scatter_tensor" : "all_gather_into_tensor";
  call.message = work;
  call.shard = collective == kReduceScatter ? at::empty({n}, work.options())
                                            : work.narrow(0, int64_t(getRank()) * n, n);
  call.op = c10d::ReduceOp::SUM;
  call.timeout = timeout;
  if (candidate.quantize) {
    requireAgreement(runShardedCpu(candidate, call, false));
  } else if (collective == kReduceScatter) {
    c10d::ReduceScatterOptions o;
    o.timeout = timeout;
    gloo_->_reduce_scatter_base(call.shard, work, o)->wait();
  } else {
    c10d::AllgatherOptions o;
    o.timeout = timeout;
    gloo_->_allgather_base(work, call.shard, o)->wait();
  }
}

std::string QncclBackend::runTunedSharded(Plan plan, ShardedCall& call) {
  // every rank reaches this call of this class in the same order: the measurement, check or
  // re-tune is collective; then the call takes the plan the table now gives
  settleClass(plan, call.message, call.timeout);
  const uint32_t seq = plan.callSeq;
  plan = planForSharded(call.collective, call.message, call.shard, call.op, call.shapeOk, true,
                        &call.config);
  plan.callSeq = seq;
  logSharded(plan, call);
  const Clock::time_point start = Clock::now();
  std::string mismatch;
  if (plan.quantize) {
    guardTransport([&] { mismatch = runShardedCpu(plan, call); });
  } else {
    // tuned: the exact call measured faster. Gloo's refusal of it (an argument error) is the
    // call's error alone: nothing of ours was on the wire, and the group stays usable
    stats_.sharded[call.collective].passthroughCalls++;
    c10::intrusive_ptr<c10d::Work> w = call.inner(gloo_.get());
    if (w) w->wait();
  }
  const int64_t bytes = call.message.numel() * int64_t(call.message.element_size());
  noteCallTime(plan.dtype, sizeClassOf(bytes), secondsSince(start), call.collective);
  return mismatch;
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
  const std::string why = replaceFile(path, tuningCacheJson(key, entries));
  if (!why.empty()) {
    std::fprintf(stderr,
                 "%sWARN could not write the tuning cache %s (%s); the choices stay in memory\n",
                 prefix().c_str(), path.c_str(), why.c_str());
  }
}

void QncclBackend::settleClass(const Plan& plan, const at::Tensor& sample,
                               std::chrono::milliseconds timeout) {
  measureClass(plan, sample, timeout, true);  // a class not in the table yet
  checkClass(plan, sample, timeout);          // an entry from the cache, at its first call
  driftCheck(plan, sample, timeout);          // at the agreed calls of the class
}

void QncclBackend::checkClass(const Plan& plan, const at::Tensor& sample,
                              std::chrono::milliseconds timeout) {
  const int32_t dtype = plan.userDtype, coll = plan.collective;
  const int64_t bytes = sample.numel() * int64_t(sample.element_size());
  const int32_t cls = sizeClassOf(bytes);
  TuneEntry cached;
  std::vector<double> factors;
  {
    std::lock_guard<std::mutex> lock(tuningMutex_);
    const TuneEntry* e = tuning_.find(dtype, cls, coll);
    if (e == nullptr || e->verified) return;
    cached = *e;
    factors = tuneTimingFactors_;
  }
  const Clock::time_point start = Clock::now();
  useCodecThreads();
  // the pair: exact and the cached choice; where that is exact, exact and the entry's fastest
  // quantized candidate (two_step/1 without times)
  const std::vector<TuneChoice> cands = tuneCandidates(getSize(), false, coll);
  TuneChoice other = cached.choice;
  if (other.exact()) {
    other = TuneChoice{kTwoStep, 1};
    double best = -1;
    for (const auto& kv : cached.seconds) {
      const bool known = std::find(cands.begin(), cands.end(), kv.first) != cands.end();
      if (!kv.first.exact() && known && kv.second >= 0 && (best < 0 || kv.second < best)) {
        best = kv.second;
        other = kv.first;
      }
    }
  }
  const TuneChoice pair[2] = {TuneChoice{}, other};
  auto factorOf = [&](const TuneChoice& c) {
    const size_t i = size_t(std::find(cands.begin(), cands.end(), c) - cands.begin());
    return i < factors.size() ? factors[i] : 1.0;
  };
  QuantConfig cfg = getConfig();
  cfg.algorithm = other.algorithm;
  cfg.microshards = other.microshards;
  const Plan candidate = quantizedPlan(tuneFacts(factsOf(sample, c10d::ReduceOp::SUM), coll), cfg);
  const at::Tensor data = tuneData(sample, coll);
  at::Tensor work = at::empty_like(data);
  c10d::AllreduceOptions opts;
  opts.timeout = timeout;
  std::string mismatch;
  guardTransport([&] { mismatch = agreeHere(plan, timeout); });
  requireAgreement(mismatch);
  double med[2] = {-1, -1};
  guardTransport([&] {
    std::vector<double> runs[2];
    // round 0 warms up (a group's first Gloo allreduce, fresh buffers' page faults), untimed
    for (int r = 0; r <= kCheckRounds; ++r) {
      for (int k = 0; k < 2; ++k) {
        const int i = (r % 2 == 0) ? k : 1 - k;  // alternate which goes first
        work.copy_(data);
        startTogether(*gloo_, timeout);
        const Clock::time_point t0 = Clock::now();
        runForTuning(i == 0 ? Plan{} : candidate, coll, work, timeout);
        if (r > 0) runs[i].push_back(secondsSince(t0) * factorOf(pair[i]));
      }
    }
    const double fastest[2] = {*std::min_element(runs[0].begin(), runs[0].end()),
                               *std::min_element(runs[1].begin(), runs[1].end())};
    std::vector<at::Tensor> ts{
        at::tensor(std::vector<double>{fastest[0], fastest[1]}, at::kDouble)};
    c10d::AllreduceOptions o = opts;
    o.reduceOp = c10d::ReduceOp::MAX;
    gloo_->allreduce(ts, o)->wait();
    med[0] = ts[0].data_ptr<double>()[0];
    med[1] = ts[0].data_ptr<double>()[1];
  });
  // the agreed times are the same numbers on every rank: every rank decides alike
  const bool disagrees = cached.choice.exact() ? med[1] < med[0] * (1.0 - kCheckNoise)
                                               : med[1] > med[0] * (1.0 + kCheckNoise);
  stats_.checkNanos += int64_t(secondsSince(start) * 1e9);
  const bool info = getRank() == 0 && settings::text("QCOMM_DEBUG") != "WARN";
  if (info) {
    std::fprintf(stderr,
                 "%sINFO checked the cached choice of %s %s, class 2^%d bytes (%s): "
                 "exact %s ms, %s %s ms (the fastest of %d paired rounds, %.3f s): %s\n",
                 prefix().c_str(), dtypeText(dtype), callsOf(coll).c_str(), int(cls),
                 choiceName(cached.choice).c_str(), jsonNumber(med[0] * 1e3).c_str(),
                 choiceName(other).c_str(), jsonNumber(med[1] * 1e3).c_str(), kCheckRounds,
                 secondsSince(start),
                 disagrees ? "it disagrees: measuring the class again" : "confirmed");
  }
  if (!disagrees) {
    stats_.checkedClasses++;
    std::lock_guard<std::mutex> lock(tuningMutex_);
    TuneEntry e = cached;
    e.verified = true;
    tuning_.put(e);
    return;
  }
  stats_.retunedClasses++;
  measureClass(plan, sample, timeout, false);  // replaces the entry, rank 0 rewrites the file
}

void QncclBackend::noteCallTime(int32_t dtype, int32_t sizeClass, double seconds,
                                int32_t collective) {
  double factor;
  {
    std::lock_guard<std::mutex> lock(tuningMutex_);
    factor = callTimingFactor_;
  }
  std::vector<double>& v = drift_[{collective, dtype, sizeClass}].seconds;
  if (v.size() < 4096) v.push_back(seconds * factor);
}

void QncclBackend::driftCheck(const Plan& plan, const at::Tensor& sample,
                              std::chrono::milliseconds timeout) {
  const int32_t dtype = plan.userDtype, coll = plan.collective;
  const int32_t cls = sizeClassOf(sample.numel() * int64_t(sample.element_size()));
  Drift& d = drift_[{coll, dtype, cls}];
  if (d.interval == 0) {
    d.interval = kDriftFirst;
    d.nextCheck = kDriftFirst;
  }
  // every rank counts the calls of the class that reach this point in the same order: the
  // comparison below runs at the same call everywhere
  const int64_t call = d.calls++;
  if (call < d.nextCheck) return;
  d.nextCheck = call + d.interval;
  double tuned = -1;
  std::string choice;
  {
    std::lock_guard<std::mutex> lock(tuningMutex_);
    const TuneEntry* e = tuning_.find(dtype, cls, coll);
    if (e != nullptr) {
      tuned = e->secondsOf(e->choice);
      choice = choiceName(e->choice);
    }
  }
  // this rank's ratios: the median real call over the tuned time (slower), and its inverse
  // (faster); 0 where there is nothing to compare. Their maximum over ranks decides, every rank
  // alike.
  double mine[2] = {0, 0};
  if (tuned > 0 && int64_t(d.seconds.size()) >= kDriftMinCalls) {
    const double m = median(d.seconds);
    mine[0] = m / tuned;
    mine[1] = m > 0 ? tuned / m : 0;
  }
  d.seconds.clear();
  std::vector<at::Tensor> ts{at::tensor(std::vector<double>{mine[0], mine[1]}, at::kDouble)};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MAX;
  o.timeout = timeout;
  guardTransport([&] { gloo_->allreduce(ts, o)->wait(); });
  const double slower = ts[0].data_ptr<double>()[0], faster = ts[0].data_ptr<double>()[1];
  if (slower <= kDriftBound && faster <= kDriftBound) return;
  if (getRank() == 0 && settings::text("QCOMM_DEBUG") != "WARN") {
    std::fprintf(
        stderr,
        "%sINFO re-tuning %s %s, class 2^%d bytes, at its call %lld: the median "
        "call of some rank took %.2fx the %s ms tuning measured for %s (tuned over median: "
        "%.2fx), beyond %.1fx either way; next comparison after %lld calls\n",
        prefix().c_str(), dtypeText(dtype), callsOf(coll).c_str(), int(cls),
        static_cast<long long>(call), slower, jsonNumber(tuned * 1e3).c_str(), choice.c_str(),
        faster, kDriftBound, static_cast<long long>(std::min(d.interval * 2, kDriftMaxInterval)));
  }
  d.interval = std::min(d.interval * 2, kDriftMaxInterval);  // back off
  d.nextCheck = call + d.interval;
  stats_.retunedClasses++;
  measureClass(plan, sample, timeout, false);
}

}  // namespace qcomm
