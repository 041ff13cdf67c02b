// The tuning table: what `auto` measured on a group's own link, per collective (allreduce,
// reduce-scatter, all-gather), dtype and message-size class (messages of [2^k, 2^(k+1)) bytes):
// pass through exactly, or quantize with an algorithm and a number of microshards. One rank decides
// each entry and every rank holds the same table, so the plan stays a pure function of shared facts
// (numel, dtype, op, world, config, table).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "plan/config.h"

namespace qcomm {

// algorithm kAlgoNone: the exact inner collective.
struct TuneChoice {
  int32_t algorithm = kAlgoNone;
  int32_t microshards = 1;
  bool exact() const { return algorithm == kAlgoNone; }
  bool operator==(const TuneChoice& o) const {
    return algorithm == o.algorithm && (exact() || microshards == o.microshards);
  }
};

// "exact", or "<algorithm>/<microshards>" ("two_step/4").
std::string choiceName(const TuneChoice& c);

struct TuneEntry {
  int32_t collective = 0;  // plan.h Collective: 0 allreduce, 1 reduce-scatter, 2 all-gather
  int32_t dtype = 0;       // the caller's dtype (codec.h kFloat32, ...)
  int32_t sizeClass = 0;   // k: messages of [2^k, 2^(k+1)) bytes
  int64_t bytes = 0;       // the message size it was measured at
  TuneChoice choice;
  // each candidate and its time in seconds (the maximum over ranks of each rank's median); a
  // candidate dropped after its first run has the time of that run
  std::vector<std::pair<TuneChoice, double>> seconds;
  // false for an entry loaded from the cache: the first call of its class confirms it with a
  // short paired measurement before the group relies on it (tuner.cpp, Tuner::check)
  bool verified = true;
  // The time measured for `c`, or -1 when there is none.
  double secondsOf(const TuneChoice& c) const {
    for (const auto& kv : seconds) {
      if (kv.first == c) return kv.second;
    }
    return -1;
  }
};

class TuningTable {
 public:
  const TuneEntry* find(int32_t dtype, int32_t sizeClass, int32_t collective = 0) const;
  void put(const TuneEntry& e);
  std::vector<TuneEntry> entries() const;  // by collective, dtype, size class
  void clear() { m_.clear(); }

 private:
  std::map<std::tuple<int32_t, int32_t, int32_t>, TuneEntry> m_;  // (collective, dtype, class)
};

// k such that bytes lies in [2^k, 2^(k+1)) (0 for bytes < 2).
int32_t sizeClassOf(int64_t bytes);

// What the tuner times for a collective (plan.h Collective), exact first. Allreduce, host memory:
// two_step at 1, 4 and 16 microshards, ring at 4 and 16, semi_ring at 4 where the world has three
// ranks or more. Reduce-scatter: two_step at 1, 4 and 16 (the rings' W - 1 requantizations cost
// error for the same bytes, the reason ZeRO++ and gZCCL left ring reduce-scatter out; an explicit
// algorithm still runs them). All-gather: the gather phase at 1 and 4 microshards (two_step/1,
// two_step/4). CUDA tensors (streamOrdered: their transports move chunks whole, so microshards
// change nothing): two_step, ring, semi_ring; two_step alone for the sharded calls.
std::vector<TuneChoice> tuneCandidates(int world, bool streamOrdered = false,
                                       int32_t collective = 0);

// The index of the choice given each candidate's time (index 0: exact; a negative time: not
// measured): the fastest quantized candidate where it is faster than exact by more than `margin`
// (0.05: 5%), so that noise does not tip a tie to the lossy path; else exact.
size_t decideTuning(const std::vector<double>& seconds, double margin);

// Candidates whose time after one run exceeds `factor` times the fastest (exact included) are
// dropped from the remaining runs: their index gets false.
std::vector<bool> keepAfterFirstRun(const std::vector<double>& seconds, double factor);

// The candidates to time after their first runs: all of them where minRounds rounds of them fit
// in `budget` seconds (a single first run is too noisy to drop on where the runs are cheap), else
// keepAfterFirstRun's.
std::vector<bool> tuneKeep(const std::vector<double>& first, double factor, double budget,
                           int minRounds);

// The timed rounds after the first runs: as many as fit in `budget` seconds of the kept
// candidates' first-run times (one run of each a round), from minRounds to maxRounds.
int tuneRounds(const std::vector<double>& first, const std::vector<bool>& keep, double budget,
               int minRounds, int maxRounds);

// The order of the n candidates (0: exact) in timed round r: exact, then the quantized ones
// starting from the r-th, so that each of them runs right after exact in one round of every n - 1
// (after exact, a token-bucket link's burst is spent by exact's bytes: a candidate always behind it
// would lose by that alone), a run the median of three or more runs is not swayed by.
std::vector<size_t> tuneRoundOrder(size_t n, int round);

}  // namespace qcomm
