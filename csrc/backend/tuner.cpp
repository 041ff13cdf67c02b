// Tuner (tuner.h): measuring, checking and re-tuning the classes `auto` decides.
#include "backend/tuner.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "backend/call.h"
#include "backend/tuning_cache.h"
#include "common/errors.h"
#include "common/settings.h"
#include "common/torch_dtype.h"
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
CallFacts sampleFacts(const at::Tensor& sample, int world, int32_t collective) {
  CallFacts f;
  f.numel = sample.numel();
  f.dtype = dtypeOf(sample.scalar_type());
  f.world = world;
  f.collective = collective;
  f.opSum = true;
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

// The numbers of every rank, their maximum on every rank.
std::vector<double> agreedMax(c10d::Backend& gloo, std::vector<double> v,
                              std::chrono::milliseconds timeout) {
  std::vector<at::Tensor> ts{at::tensor(v, at::kDouble)};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MAX;
  o.timeout = timeout;
  gloo.allreduce(ts, o)->wait();
  std::copy_n(ts[0].data_ptr<double>(), v.size(), v.begin());
  return v;
}

// Rank 0's `value`, on every rank.
int64_t fromRankZero(c10d::Backend& gloo, int64_t value, std::chrono::milliseconds timeout) {
  std::vector<at::Tensor> pick{at::full({1}, value, at::kLong)};
  c10d::BroadcastOptions b;
  b.rootRank = 0;
  b.timeout = timeout;
  gloo.broadcast(pick, b)->wait();
  return pick[0].item<int64_t>();
}

// What the check of a cached entry runs beside exact: the cached choice; where that is exact, the
// entry's fastest quantized candidate still offered (two_step/1 without times).
TuneChoice checkPartner(const TuneEntry& cached, const std::vector<TuneChoice>& cands) {
  if (!cached.choice.exact()) return cached.choice;
  TuneChoice other{kTwoStep, 1};
  double best = -1;
  for (const auto& kv : cached.seconds) {
    const bool known = std::find(cands.begin(), cands.end(), kv.first) != cands.end();
    if (!kv.first.exact() && known && kv.second >= 0 && (best < 0 || kv.second < best)) {
      best = kv.second;
      other = kv.first;
    }
  }
  return other;
}

}  // namespace

std::vector<TuneEntry> Tuner::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return table_.entries();
}

void Tuner::load(const std::vector<TuneEntry>& entries) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (TuneEntry e : entries) {
    e.verified = false;  // checked at the first call of its class (check)
    table_.put(e);
  }
}

void Tuner::setCache(const std::string& path, const std::string& keyJson) {
  std::lock_guard<std::mutex> lock(mutex_);
  file_ = path;
  key_ = keyJson;
}

std::string Tuner::cachePath() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return file_;
}

void Tuner::forget() {
  std::lock_guard<std::mutex> lock(mutex_);
  table_.clear();
  file_.clear();
}

std::vector<double> Tuner::factors() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timingFactors_;
}

Plan Tuner::decide(const Plan& plan, const CallFacts& facts, const QuantConfig& config,
                   const at::Tensor& sample, std::chrono::milliseconds timeout, bool settle) {
  if (settle) {
    measure(plan, sample, timeout, true);  // a class not in the table yet
    check(plan, sample, timeout);          // an entry from the cache, at its first call
    driftCheck(plan, sample, timeout);     // at the agreed calls of the class
  }
  const int32_t cls = sizeClassOf(facts.numel * dtypeBytes(facts.dtype));
  std::lock_guard<std::mutex> lock(mutex_);
  return tunedPlan(facts, config, table_.find(facts.dtype, cls, facts.collective));
}

Plan Tuner::peek(const CallFacts& facts, const QuantConfig& config) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return makePlan(facts, config, &table_);
}

void Tuner::measure(const Plan& plan, const at::Tensor& sample, std::chrono::milliseconds timeout,
                    bool onlyIfMissing) {
  const int32_t dtype = plan.userDtype, coll = plan.collective;
  const int64_t bytes = sample.numel() * int64_t(sample.element_size());
  const int32_t cls = sizeClassOf(bytes);
  if (onlyIfMissing) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (table_.find(dtype, cls, coll) != nullptr) return;  // an earlier call measured the class
  }
  const Clock::time_point start = Clock::now();
  g_.useCodecThreads();
  // every rank measures the same class: the call's header first (a mismatch raises on every
  // rank alike and leaves the group usable)
  std::string mismatch;
  g_.guardTransport([&] { mismatch = g_.agreeHere(plan, timeout); });
  g_.requireAgreement(mismatch, "tune", coll);
  std::vector<bool> keep;
  g_.guardTransport([&] {
    TuneEntry e = timeCandidates(plan, sample, timeout, &keep);
    std::lock_guard<std::mutex> lock(mutex_);
    table_.put(e);
  });
  const double took = secondsSince(start);
  g_.stats.tunedClasses++;
  g_.stats.tuneNanos += int64_t(took * 1e9);
  if (g_.rank != 0) return;
  save();
  logMeasured(dtype, cls, coll, bytes, took, keep);
}

TuneEntry Tuner::timeCandidates(const Plan& plan, const at::Tensor& sample,
                                std::chrono::milliseconds timeout, std::vector<bool>* keep) {
  const int32_t coll = plan.collective;
  const std::vector<TuneChoice> cands = tuneCandidates(g_.size, false, coll);
  const size_t n = cands.size();
  const std::vector<double> factor = factors();
  QuantConfig cfg = g_.config();
  const CallFacts facts = sampleFacts(sample, g_.size, coll);
  const at::Tensor data = tuneData(sample, coll);
  at::Tensor work = at::empty_like(data);
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
    startTogether(*g_.gloo, timeout);
    const Clock::time_point t0 = Clock::now();
    runCandidate(candidate, coll, work, timeout);
    return secondsSince(t0) * (i < factor.size() ? factor[i] : 1.0);
  };
  std::vector<double> first(n), med(n, -1.0);
  for (size_t i = 0; i < n; ++i) first[i] = runOnce(i);
  first = agreedMax(*g_.gloo, first, timeout);
  *keep = tuneKeep(first, kDropFactor, kBudget, kMinRuns);
  // from the agreed times: every rank runs the same number
  const int timed = tuneRounds(first, *keep, kBudget, kMinRuns, kMaxRuns);
  std::vector<std::vector<double>> runs(n);
  for (int r = 0; r < timed; ++r) {
    for (size_t i : tuneRoundOrder(n, r)) {
      if ((*keep)[i]) runs[i].push_back(runOnce(i));
    }
  }
  for (size_t i = 0; i < n; ++i) med[i] = (*keep)[i] ? median(runs[i]) : -1.0;
  med = agreedMax(*g_.gloo, med, timeout);
  // one rank decides, every rank takes its choice (identical inputs already; this makes the
  // table a shared fact whatever the arithmetic)
  const int64_t chosen = fromRankZero(*g_.gloo, decideTuning(med, kMargin), timeout);
  TORCH_CHECK(chosen >= 0 && size_t(chosen) < n, g_.prefix(), "tune: rank 0 chose candidate ",
              chosen, " of ", n);
  TuneEntry e;
  e.collective = coll;
  e.dtype = plan.userDtype;
  e.sizeClass = sizeClassOf(sample.numel() * int64_t(sample.element_size()));
  e.bytes = sample.numel() * int64_t(sample.element_size());
  e.choice = cands[size_t(chosen)];
  for (size_t i = 0; i < n; ++i) e.seconds.emplace_back(cands[i], med[i] >= 0 ? med[i] : first[i]);
  return e;
}

void Tuner::logMeasured(int32_t dtype, int32_t cls, int32_t coll, int64_t bytes, double took,
                        const std::vector<bool>& keep) const {
  if (settings::text("QCOMM_DEBUG") == "WARN") return;
  std::lock_guard<std::mutex> lock(mutex_);
  const TuneEntry* e = table_.find(dtype, cls, coll);
  std::string times;
  for (size_t i = 0; i < e->seconds.size(); ++i) {
    const auto& kv = e->seconds[i];
    times += (times.empty() ? "" : ", ") + choiceName(kv.first) + " " +
             jsonNumber(kv.second * 1e3) + " ms" +
             (i < keep.size() && !keep[i] ? " (one run, dropped)" : "");
  }
  std::fprintf(stderr,
               "%sINFO tuned host-memory %s of %s, class 2^%d bytes (measured at %lld "
               "B, %.2f s): %s (%s)\n",
               g_.prefix().c_str(), callsOf(coll).c_str(), dtypeText(dtype), int(cls),
               static_cast<long long>(bytes), took, choiceName(e->choice).c_str(), times.c_str());
}

void Tuner::runCandidate(const Plan& candidate, int32_t collective, at::Tensor& work,
                         std::chrono::milliseconds timeout) {
  // work is the message (the allreduce's tensor, the reduce-scatter's input, the all-gather's
  // output); the all-gather's input is this rank's slot of it, in place (FSDP2's)
  const int64_t n = work.numel() / g_.size;
  Call call;
  call.collective = collective;
  call.name = collective == kAllreduce       ? "allreduce"
              : collective == kReduceScatter ? "reduce_scatter_tensor"
                                             : "all_gather_into_tensor";
  call.message = work;
  if (collective == kReduceScatter) call.shard = at::empty({n}, work.options());
  if (collective == kAllGather) call.shard = work.narrow(0, int64_t(g_.rank) * n, n);
  call.op = c10d::ReduceOp::SUM;
  call.timeout = timeout;
  if (candidate.quantize) {
    g_.requireAgreement(runHost(g_, candidate, call, false), call.name, collective);
  } else if (collective == kAllreduce) {
    c10d::AllreduceOptions o;
    o.timeout = timeout;
    std::vector<at::Tensor> ts{work};
    g_.gloo->allreduce(ts, o)->wait();
  } else if (collective == kReduceScatter) {
    c10d::ReduceScatterOptions o;
    o.timeout = timeout;
    g_.gloo->_reduce_scatter_base(call.shard, work, o)->wait();
  } else {
    c10d::AllgatherOptions o;
    o.timeout = timeout;
    g_.gloo->_allgather_base(work, call.shard, o)->wait();
  }
}

void Tuner::save() const {
  std::string path, key;
  std::vector<TuneEntry> entries;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    path = file_;
    key = key_;
    entries = table_.entries();
  }
  if (path.empty()) return;
  const std::string why = replaceFile(path, tuningCacheJson(key, entries));
  if (!why.empty()) {
    std::fprintf(stderr,
                 "%sWARN could not write the tuning cache %s (%s); the choices stay in memory\n",
                 g_.prefix().c_str(), path.c_str(), why.c_str());
  }
}

void Tuner::check(const Plan& plan, const at::Tensor& sample, std::chrono::milliseconds timeout) {
  const int32_t dtype = plan.userDtype, coll = plan.collective;
  const int32_t cls = sizeClassOf(sample.numel() * int64_t(sample.element_size()));
  TuneEntry cached;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const TuneEntry* e = table_.find(dtype, cls, coll);
    if (e == nullptr || e->verified) return;
    cached = *e;
  }
  const Clock::time_point start = Clock::now();
  g_.useCodecThreads();
  // the pair: exact and the cached choice; where that is exact, exact and the entry's fastest
  // quantized candidate (two_step/1 without times)
  const std::vector<TuneChoice> cands = tuneCandidates(g_.size, false, coll);
  const TuneChoice other = checkPartner(cached, cands);
  const std::vector<double> factor = factors();
  auto factorOf = [&](const TuneChoice& c) {
    const size_t i = size_t(std::find(cands.begin(), cands.end(), c) - cands.begin());
    return i < factor.size() ? factor[i] : 1.0;
  };
  const double factors2[2] = {factorOf(TuneChoice{}), factorOf(other)};
  QuantConfig cfg = g_.config();
  cfg.algorithm = other.algorithm;
  cfg.microshards = other.microshards;
  const Plan candidate = quantizedPlan(sampleFacts(sample, g_.size, coll), cfg);
  std::string mismatch;
  g_.guardTransport([&] { mismatch = g_.agreeHere(plan, timeout); });
  g_.requireAgreement(mismatch, "tune", coll);
  double med[2] = {-1, -1};
  g_.guardTransport(
      [&] { checkRuns(candidate, coll, tuneData(sample, coll), timeout, factors2, med); });
  // the agreed times are the same numbers on every rank: every rank decides alike
  const bool disagrees = cached.choice.exact() ? med[1] < med[0] * (1.0 - kCheckNoise)
                                               : med[1] > med[0] * (1.0 + kCheckNoise);
  g_.stats.checkNanos += int64_t(secondsSince(start) * 1e9);
  if (g_.rank == 0 && settings::text("QCOMM_DEBUG") != "WARN") {
    std::fprintf(stderr,
                 "%sINFO checked the cached choice of %s %s, class 2^%d bytes (%s): "
                 "exact %s ms, %s %s ms (the fastest of %d paired rounds, %.3f s): %s\n",
                 g_.prefix().c_str(), dtypeText(dtype), callsOf(coll).c_str(), int(cls),
                 choiceName(cached.choice).c_str(), jsonNumber(med[0] * 1e3).c_str(),
                 choiceName(other).c_str(), jsonNumber(med[1] * 1e3).c_str(), kCheckRounds,
                 secondsSince(start),
                 disagrees ? "it disagrees: measuring the class again" : "confirmed");
  }
  if (disagrees) {
    g_.stats.retunedClasses++;
    measure(plan, sample, timeout, false);  // replaces the entry, rank 0 rewrites the file
    return;
  }
  g_.stats.checkedClasses++;
  std::lock_guard<std::mutex> lock(mutex_);
  cached.verified = true;
  table_.put(cached);
}

void Tuner::checkRuns(const Plan& candidate, int32_t coll, const at::Tensor& data,
                      std::chrono::milliseconds timeout, const double factor[2], double out[2]) {
  at::Tensor work = at::empty_like(data);
  std::vector<double> runs[2];
  // round 0 warms up (a group's first Gloo allreduce, fresh buffers' page faults), untimed
  for (int r = 0; r <= kCheckRounds; ++r) {
    for (int k = 0; k < 2; ++k) {
      const int i = (r % 2 == 0) ? k : 1 - k;  // alternate which goes first
      work.copy_(data);
      startTogether(*g_.gloo, timeout);
      const Clock::time_point t0 = Clock::now();
      runCandidate(i == 0 ? Plan{} : candidate, coll, work, timeout);
      if (r > 0) runs[i].push_back(secondsSince(t0) * factor[i]);
    }
  }
  const std::vector<double> fastest = agreedMax(*g_.gloo,
                                                {*std::min_element(runs[0].begin(), runs[0].end()),
                                                 *std::min_element(runs[1].begin(), runs[1].end())},
                                                timeout);
  out[0] = fastest[0];
  out[1] = fastest[1];
}

void Tuner::noteCallTime(const CallFacts& facts, double seconds) {
  double factor;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    factor = callTimingFactor_;
  }
  const int32_t cls = sizeClassOf(facts.numel * dtypeBytes(facts.dtype));
  std::vector<double>& v = drift_[{facts.collective, facts.dtype, cls}].seconds;
  if (v.size() < 4096) v.push_back(seconds * factor);
}

void Tuner::driftCheck(const Plan& plan, const at::Tensor& sample,
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
    std::lock_guard<std::mutex> lock(mutex_);
    const TuneEntry* e = table_.find(dtype, cls, coll);
    if (e != nullptr) {
      tuned = e->secondsOf(e->choice);
      choice = choiceName(e->choice);
    }
  }
  // this rank's ratios: the median real call over the tuned time (slower), and its inverse
  // (faster); 0 where there is nothing to compare. Their maximum over ranks decides, every rank
  // alike.
  std::vector<double> ratio{0, 0};
  if (tuned > 0 && int64_t(d.seconds.size()) >= kDriftMinCalls) {
    const double m = median(d.seconds);
    ratio = {m / tuned, m > 0 ? tuned / m : 0};
  }
  d.seconds.clear();
  g_.guardTransport([&] { ratio = agreedMax(*g_.gloo, ratio, timeout); });
  const double slower = ratio[0], faster = ratio[1];
  if (slower <= kDriftBound && faster <= kDriftBound) return;
  if (g_.rank == 0 && settings::text("QCOMM_DEBUG") != "WARN") {
    std::fprintf(
        stderr,
        "%sINFO re-tuning %s %s, class 2^%d bytes, at its call %lld: the median "
        "call of some rank took %.2fx the %s ms tuning measured for %s (tuned over median: "
        "%.2fx), beyond %.1fx either way; next comparison after %lld calls\n",
        g_.prefix().c_str(), dtypeText(dtype), callsOf(coll).c_str(), int(cls),
        static_cast<long long>(call), slower, jsonNumber(tuned * 1e3).c_str(), choice.c_str(),
        faster, kDriftBound, static_cast<long long>(std::min(d.interval * 2, kDriftMaxInterval)));
  }
  d.interval = std::min(d.interval * 2, kDriftMaxInterval);  // back off
  d.nextCheck = call + d.interval;
  g_.stats.retunedClasses++;
  measure(plan, sample, timeout, false);
}

}  // namespace qcomm
