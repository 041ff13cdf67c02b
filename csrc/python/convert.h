// QuantConfig to and from Python: the tuple of QuantConfig.as_tuple() (qcomm/config.py), and the
// dict QuantConfig.from_dict reads.
#pragma once

#include <pybind11/pybind11.h>

#include "plan/config.h"

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
  c.rotate = cfg[7].cast<bool>();
  c.stochasticRounding = cfg[8].cast<bool>();
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
  return d;
}

}  // namespace qcomm
