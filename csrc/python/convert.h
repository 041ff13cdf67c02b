// QuantConfig to and from Python: the tuple of QuantConfig.as_tuple() (qcomm/config.py), and the
// dict QuantConfig.from_dict reads.
#pragma once

#include <pybind11/pybind11.h>

#include <cmath>

#include "plan/config.h"
#include "plan/tuning.h"

namespace qcomm {

inline QuantConfig configFromTuple(const pybind11::tuple& cfg) {
  QuantConfig c;
  c.algorithm = cfg[0].cast<int>();
  c.rsBits = cfg[1].cast<int>();
  c.agBits = cfg[2].cast<int>();
  c.groupSize = cfg[3].cast<int>();
  c.symmetric = cfg[4].cast<bool>();
  c.minBytes = cfg[5].cast<int64_t>();
  c.microshards = cfg[6].cast<int>();
  c.rotate = cfg[7].cast<int>();  // -1: rotates() decides
  c.stochasticRounding = cfg[8].cast<bool>();
  c.tune = cfg[9].cast<bool>();
  c.shadow = cfg[10].cast<int>();
  // the sharded collectives' switches, off where an older tuple has no such fields
  if (cfg.size() > 12) {
    c.reduceScatter = cfg[11].cast<bool>();
    c.allGather = cfg[12].cast<bool>();
  }
  validateConfig(c);
  return c;
}

inline pybind11::dict configToDict(const QuantConfig& c) {
  pybind11::dict d;
  d["algorithm"] = c.algorithm;
  d["rs_bits"] = c.rsBits;
  d["ag_bits"] = c.agBits;
  d["group_size"] = c.groupSize;
  d["symmetric"] = c.symmetric;
  d["min_bytes"] = c.minBytes;
  d["microshards"] = c.microshards;
  d["rotate"] = c.rotate;
  d["stochastic_rounding"] = c.stochasticRounding;
  d["tune"] = c.tune;
  d["shadow"] = c.shadow;
  d["reduce_scatter"] = c.reduceScatter;
  d["all_gather"] = c.allGather;
  return d;
}

// A tuning-table entry as qcomm.tuning() gives it and the cache file holds it.
inline pybind11::dict entryToDict(const TuneEntry& e) {
  pybind11::dict d;
  d["collective"] = e.collective;
  d["dtype"] = e.dtype;
  d["size_class"] = e.sizeClass;
  d["bytes"] = e.bytes;
  d["algorithm"] = e.choice.algorithm;
  d["microshards"] = e.choice.microshards;
  d["choice"] = choiceName(e.choice);
  pybind11::dict seconds;
  for (const auto& kv : e.seconds) seconds[pybind11::str(choiceName(kv.first))] = kv.second;
  d["seconds"] = seconds;
  d["verified"] = e.verified;
  return d;
}

// An entry as qcomm's cache loader checked it: dtype code, size class, bytes, algorithm code
// (none: exact), microshards, and optionally the candidates' times, a list of (algorithm code,
// microshards, seconds), and the collective (plan.h Collective; absent: the allreduce).
inline TuneEntry entryFromTuple(const pybind11::tuple& t) {
  TuneEntry e;
  e.dtype = t[0].cast<int32_t>();
  e.sizeClass = t[1].cast<int32_t>();
  e.bytes = t[2].cast<int64_t>();
  e.choice.algorithm = t[3].cast<int32_t>();
  e.choice.microshards = t[4].cast<int32_t>();
  TORCH_CHECK_VALUE(e.dtype >= 0 && e.dtype <= 2 && e.sizeClass >= 0 && e.sizeClass < 63 &&
                        (e.choice.algorithm == kAlgoNone ||
                         (e.choice.algorithm >= kTwoStep && e.choice.algorithm <= kSemiRing)) &&
                        e.choice.microshards >= 1 && e.choice.microshards <= 64,
                    "[qcomm] invalid tuning entry");
  if (t.size() > 5) {
    for (const auto& item : t[5].cast<pybind11::list>()) {
      const auto s = item.cast<pybind11::tuple>();
      TuneChoice c{s[0].cast<int32_t>(), s[1].cast<int32_t>()};
      const double sec = s[2].cast<double>();
      TORCH_CHECK_VALUE(
          (c.algorithm == kAlgoNone || (c.algorithm >= kTwoStep && c.algorithm <= kSemiRing)) &&
              c.microshards >= 1 && c.microshards <= 64 && std::isfinite(sec) && sec >= 0,
          "[qcomm] invalid tuning time");
      e.seconds.emplace_back(c, sec);
    }
  }
  if (t.size() > 6) {
    e.collective = t[6].cast<int32_t>();
    TORCH_CHECK_VALUE(e.collective >= 0 && e.collective <= 2, "[qcomm] invalid tuning entry");
  }
  return e;
}

}  // namespace qcomm
