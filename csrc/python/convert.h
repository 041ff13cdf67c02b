// QuantConfig to and from Python, by field name: the dict of QuantConfig.encoded()
// (qcomm/config.py), and the dict QuantConfig.from_dict reads.
#pragma once

#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>

#include <cmath>
#include <string>

#include "plan/config.h"
#include "plan/tuning.h"

namespace qcomm {

// A config from Python: a dict of every field by its Python name, encoded as
// qcomm.QuantConfig.encoded() gives it (algorithm code, bits 0 for none, rotate -1 for unset).
// Never by position: a missing or unknown field is a ValueError naming it.
inline QuantConfig configFrom(const pybind11::handle& obj) {
  namespace py = pybind11;
  TORCH_CHECK_VALUE(py::isinstance<py::dict>(obj),
                    "[qcomm] a config is passed as a dict of its fields "
                    "(qcomm.QuantConfig.encoded()), got ",
                    std::string(py::str(obj.get_type())));
  const py::dict d = py::reinterpret_borrow<py::dict>(obj);
  QuantConfig c;
  size_t known = 0;
#define QCOMM_CONFIG_FROM(type, member, name, value, key)                              \
  TORCH_CHECK_VALUE(d.contains(name), "[qcomm] the config has no field '", name, "'"); \
  c.member = d[name].cast<type>();                                                     \
  ++known;
  QCOMM_CONFIG_FIELDS(QCOMM_CONFIG_FROM)
#undef QCOMM_CONFIG_FROM
  if (d.size() != known) {
    for (const auto& kv : d) {
      const std::string k = py::str(kv.first);
      bool found = false;
#define QCOMM_CONFIG_NAMED(type, member, name, value, key) found = found || k == name;
      QCOMM_CONFIG_FIELDS(QCOMM_CONFIG_NAMED)
#undef QCOMM_CONFIG_NAMED
      TORCH_CHECK_VALUE(found, "[qcomm] the config has an unknown field '", k, "'");
    }
  }
  validateConfig(c);
  return c;
}

// The inverse of configFrom: every field by its Python name.
inline pybind11::dict configToDict(const QuantConfig& c) {
  pybind11::dict d;
#define QCOMM_CONFIG_TO(type, member, name, value, key) d[name] = c.member;
  QCOMM_CONFIG_FIELDS(QCOMM_CONFIG_TO)
#undef QCOMM_CONFIG_TO
  return d;
}

// The declaration (plan/config.h QCOMM_CONFIG_FIELDS), in order: name, default (encoded), whether
// the field keys the tuning table.
inline pybind11::list configFields() {
  pybind11::list out;
  const QuantConfig defaults;
#define QCOMM_CONFIG_FIELD(type, member, name, value, key)              \
  out.append(pybind11::dict(pybind11::arg("name") = name,               \
                            pybind11::arg("default") = defaults.member, \
                            pybind11::arg("tuning_key") = bool(key)));
  QCOMM_CONFIG_FIELDS(QCOMM_CONFIG_FIELD)
#undef QCOMM_CONFIG_FIELD
  return out;
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
