// Tuner: what `auto` runs, measured (plan/tuning.h), for host-memory allreduces, reduce-scatters
// and all-gathers. On the group's progress thread, at the first eligible call of a collective,
// dtype and size class (QuantConfig.tune) or when qcomm.tune asks, every rank times the exact
// inner collective and each quantized candidate on copies of the same message, interleaved; the
// times agreed (the maximum over ranks) decide, rank 0 broadcasts the choice, and every rank
// enters it in its table. Rank 0 then writes the table to the cache file qcomm named
// (tuning_cache.h). An entry loaded from that cache is checked at the first call of its class
// before it is relied on; and every so many calls of a class the ranks compare their real calls'
// durations with the tuned time, re-tuning the class when they drifted (all of it at a call every
// rank reaches at the same point).
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backend/group.h"
#include "plan/plan.h"
#include "plan/tuning.h"

namespace qcomm {

class Tuner {
 public:
  explicit Tuner(Group& group) : g_(group) {}

  // The table every rank of the group holds alike.
  std::vector<TuneEntry> entries() const;
  // Entries every rank loads alike (qcomm's cache, read by rank 0 and shared through the store).
  void load(const std::vector<TuneEntry>& entries);
  // Rank 0 writes the table to `path` (JSON, under `keyJson`) after each measurement; "" never.
  void setCache(const std::string& path, const std::string& keyJson);
  std::string cachePath() const;
  // A config with another tuning key was set: the table no longer says what is fastest, and the
  // cache file is keyed by the config the group was created with.
  void forget();

  // THE point where a call reads the table (on the progress thread, where every rank reaches the
  // call at the same point of the same sequence): `plan`, the config's plan of the call (auto,
  // host memory), becomes the table's choice for its class: a quantized plan of the chosen
  // algorithm, or a pass-through one where exact measured faster. With `settle` (config.tune)
  // the class is first measured if missing, checked if loaded from the cache, and compared for
  // drift at the agreed calls (collective: every rank runs it at the same call).
  Plan decide(const Plan& plan, const CallFacts& facts, const QuantConfig& config,
              const at::Tensor& sample, std::chrono::milliseconds timeout, bool settle);
  // The plan the table gives now (qcomm.plan's diagnostics; no call reads it here).
  Plan peek(const CallFacts& facts, const QuantConfig& config) const;
  // The duration of a real call of a tuned class, for the drift check (on the progress thread).
  void noteCallTime(const CallFacts& facts, double seconds);
  // Measures now (on the progress thread; collective) the class of `plan` on copies of `sample`.
  void measure(const Plan& plan, const at::Tensor& sample, std::chrono::milliseconds timeout,
               bool onlyIfMissing);

 private:
  // The test hooks skew this rank's timings through this one friend.
  friend struct BackendTestAccess;
  void check(const Plan& plan, const at::Tensor& sample, std::chrono::milliseconds timeout);
  void driftCheck(const Plan& plan, const at::Tensor& sample, std::chrono::milliseconds timeout);
  // One run of a tuning candidate of `collective` on `work` (the message): the exact inner
  // collective where the candidate does not quantize, else its quantized run, counted nowhere.
  void runCandidate(const Plan& candidate, int32_t collective, at::Tensor& work,
                    std::chrono::milliseconds timeout);
  // The candidates' paired check runs of check(), agreed over ranks: the fastest of each.
  void checkRuns(const Plan& candidate, int32_t coll, const at::Tensor& data,
                 std::chrono::milliseconds timeout, const double factor[2], double out[2]);
  // The timed rounds of measure(), agreed: each candidate's median (first: the first runs).
  TuneEntry timeCandidates(const Plan& plan, const at::Tensor& sample,
                           std::chrono::milliseconds timeout, std::vector<bool>* keep);
  void save() const;
  void logMeasured(int32_t dtype, int32_t cls, int32_t coll, int64_t bytes, double took,
                   const std::vector<bool>& keep) const;
  std::vector<double> factors() const;

  Group& g_;
  mutable std::mutex mutex_;  // guards the five below
  TuningTable table_;
  std::string file_, key_;
  // the test hooks' factors: this rank's measured time of candidate i (tuning and checks) is
  // multiplied by timingFactors_[i]; the duration of each real call tracked for drift, by
  // callTimingFactor_
  std::vector<double> timingFactors_;
  double callTimingFactor_ = 1.0;
  // Per (collective, dtype, size class), on the progress thread only: the real calls' durations
  // since the last drift check, the calls of the class so far, the call of the next check and the
  // interval (doubled after each re-tune: a back-off).
  struct Drift {
    std::vector<double> seconds;
    int64_t calls = 0;
    int64_t nextCheck = 0;
    int64_t interval = 0;
  };
  std::map<std::tuple<int32_t, int32_t, int32_t>, Drift> drift_;
};

}  // namespace qcomm
