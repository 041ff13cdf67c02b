// QuantConfig: every knob of a qnccl group, mirrored by the Python dataclass qcomm.QuantConfig.
#pragma once

#include <cstdint>
#include <string>

namespace qcomm {

// The numbers are part of the C++/Python contract (qcomm/config.py ALGORITHMS).
enum Algo : int32_t { kAuto = 0, kTwoStep = 1, kRing = 2, kSemiRing = 3, kAlgoNone = 4 };

// Every field of QuantConfig, declared once: X(type, member, Python name, default, tuning key).
// The struct, the conversion to and from Python (by name: python/convert.h), qcomm._C's
// config_fields() (which qcomm/config.py's dataclass and its tests check against), and what a
// new config invalidates of the tuning table (QncclBackend::setConfig; qcomm/_tuning.py's cache
// key) are derived from it. A field that keys the tuning table changes what is fastest: the table
// measured under another value is dropped. Adding a field: one line here, its meaning below, its
// QCOMM_* setting (common/settings.cpp) and the dataclass field (qcomm/config.py).
//   algorithm: Algo. rsBits / agBits: 0 (none), 4 or 8. groupSize: elements per scale.
//   rotate: Hadamard-rotate each group before quantizing (codec.h hadamardGroup): 1 on, 0 off,
//     -1 (the default) on where a phase has 4 bits (rotates(); per collective: rotatesCall).
//   stochasticRounding: round codes stochastically (codec.h quantizeStochastic).
//   tune: auto measures, at the first eligible call of each collective, dtype and size class,
//     whether and how to quantize on this link (plan/tuning.h); an explicit algorithm never is.
//   shadow: every shadow-th quantized call (by the call's sequence number, alike on every rank)
//     also runs the exact call on a copy and records the error; 0: off.
//   reduceScatter / allGather: quantize eligible reduce-scatters with the reduce codec and
//     all-gathers with the gather codec; off by default (an all-gather changes what every rank
//     computes with, a reduce-scatter only the sums).
#define QCOMM_CONFIG_FIELDS(X)                                    \
  X(int32_t, algorithm, "algorithm", kAuto, false)                \
  X(int32_t, rsBits, "rs_bits", 8, true)                          \
  X(int32_t, agBits, "ag_bits", 8, true)                          \
  X(int32_t, groupSize, "group_size", 128, true)                  \
  X(bool, symmetric, "symmetric", false, true)                    \
  X(int64_t, minBytes, "min_bytes", int64_t(1) << 20, true)       \
  X(int32_t, microshards, "microshards", 4, false)                \
  X(int32_t, rotate, "rotate", -1, false)                         \
  X(bool, stochasticRounding, "stochastic_rounding", false, true) \
  X(bool, tune, "tune", true, false)                              \
  X(int32_t, shadow, "shadow", 0, false)                          \
  X(bool, reduceScatter, "reduce_scatter", false, false)          \
  X(bool, allGather, "all_gather", false, false)

struct QuantConfig {
#define QCOMM_CONFIG_MEMBER(type, member, name, value, key) type member = value;
  QCOMM_CONFIG_FIELDS(QCOMM_CONFIG_MEMBER)
#undef QCOMM_CONFIG_MEMBER
};

// Whether the codec rotates: rotate, or with rotate = -1 whether a phase has 4 bits (on a real
// model's activations 4-bit groups without the rotation lose far more: benchmarks/results/
// 04-smollm2-tensor-parallel.md). qcomm/config.py QuantConfig.rotates says the same.
bool rotates(const QuantConfig& c);

// Throws c10::ValueError naming the knob, the value given and what is allowed.
void validateConfig(const QuantConfig& c);

const char* algoName(int32_t algo);

}  // namespace qcomm
