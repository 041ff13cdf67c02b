// The tuning table and the tuner's decision rule (plan/tuning.h).
#include "plan/tuning.h"

#include <algorithm>

namespace qcomm {

std::string choiceName(const TuneChoice& c) {
  if (c.exact()) return "exact";
  return std::string(algoName(c.algorithm)) + "/" + std::to_string(c.microshards);
}

const TuneEntry* TuningTable::find(int32_t dtype, int32_t sizeClass, int32_t collective) const {
  auto it = m_.find({collective, dtype, sizeClass});
  return it == m_.end() ? nullptr : &it->second;
}

void TuningTable::put(const TuneEntry& e) { m_[{e.collective, e.dtype, e.sizeClass}] = e; }

std::vector<TuneEntry> TuningTable::entries() const {
  std::vector<TuneEntry> out;
  for (const auto& kv : m_) out.push_back(kv.second);
  return out;
}

int32_t sizeClassOf(int64_t bytes) {
  int32_t k = 0;
  while (k < 62 && (int64_t(2) << k) <= bytes) ++k;
  return k;
}

std::vector<TuneChoice> tuneCandidates(int world, bool streamOrdered, int32_t collective) {
  if (collective != 0) {  // reduce-scatter, all-gather: two_step's reduce half, the gather phase
    std::vector<TuneChoice> c = {TuneChoice{}, TuneChoice{kTwoStep, 1}};
    if (streamOrdered) return c;
    c.push_back(TuneChoice{kTwoStep, 4});
    if (collective == 1) c.push_back(TuneChoice{kTwoStep, 16});
    return c;
  }
  if (streamOrdered) {
    std::vector<TuneChoice> c = {TuneChoice{}, TuneChoice{kTwoStep, 1}, TuneChoice{kRing, 1}};
    if (world >= 3) c.push_back(TuneChoice{kSemiRing, 1});
    return c;
  }
  std::vector<TuneChoice> c = {TuneChoice{},
                               TuneChoice{kTwoStep, 1},
                               TuneChoice{kTwoStep, 4},
                               TuneChoice{kTwoStep, 16},
                               TuneChoice{kRing, 4},
                               TuneChoice{kRing, 16}};
  if (world >= 3) c.push_back(TuneChoice{kSemiRing, 4});
  return c;
}

size_t decideTuning(const std::vector<double>& seconds, double margin) {
  size_t best = 0;
  for (size_t i = 1; i < seconds.size(); ++i) {
    if (seconds[i] < 0) continue;
    if (best == 0 || seconds[i] < seconds[best]) best = i;
  }
  if (best == 0 || seconds.empty() || seconds[0] < 0) return best;
  return seconds[best] < seconds[0] * (1.0 - margin) ? best : 0;
}

std::vector<bool> keepAfterFirstRun(const std::vector<double>& seconds, double factor) {
  double fastest = -1;
  for (double s : seconds) {
    if (s >= 0 && (fastest < 0 || s < fastest)) fastest = s;
  }
  std::vector<bool> keep(seconds.size());
  for (size_t i = 0; i < seconds.size(); ++i) {
    keep[i] = i == 0 || (seconds[i] >= 0 && seconds[i] <= factor * fastest);
  }
  return keep;
}

std::vector<bool> tuneKeep(const std::vector<double>& first, double factor, double budget,
                           int minRounds) {
  double round = 0;
  for (double s : first) round += std::max(s, 0.0);
  if (round * minRounds <= budget) return std::vector<bool>(first.size(), true);
  return keepAfterFirstRun(first, factor);
}

int tuneRounds(const std::vector<double>& first, const std::vector<bool>& keep, double budget,
               int minRounds, int maxRounds) {
  double round = 0;
  for (size_t i = 0; i < first.size() && i < keep.size(); ++i) round += keep[i] ? first[i] : 0.0;
  return std::clamp(int(budget / std::max(round, 1e-6)), minRounds, maxRounds);
}

std::vector<size_t> tuneRoundOrder(size_t n, int round) {
  std::vector<size_t> order;
  if (n == 0) return order;
  order.push_back(0);  // exact first, then the quantized candidates from the round's one on
  const size_t m = n - 1;
  for (size_t k = 0; k < m; ++k) order.push_back(1 + (k + size_t(round)) % m);
  return order;
}

}  // namespace qcomm
