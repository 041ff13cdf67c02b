// QuantConfig: every knob of a qnccl group, mirrored by the Python dataclass qcomm.QuantConfig.
#pragma once

#include <cstdint>
#include <string>

namespace qcomm {

// The numbers are part of the C++/Python contract (qcomm/config.py ALGORITHMS).
enum Algo : int32_t { kAuto = 0, kTwoStep = 1, kRing = 2, kSemiRing = 3, kAlgoNone = 4 };

struct QuantConfig {
  int32_t algorithm = kAuto;
  int32_t rsBits = 8;  // 0 (none), 4 or 8
  int32_t agBits = 8;  // 0 (none), 4 or 8
  int32_t groupSize = 128;
  bool symmetric = false;
  int64_t minBytes = 1 << 20;
  int32_t microshards = 4;
  // Hadamard-rotate each group before quantizing (codec.h hadamardGroup): 1 on, 0 off, -1 (the
  // default) on where a phase has 4 bits (rotates())
  int32_t rotate = -1;
  bool stochasticRounding = false;  // round codes stochastically (codec.h quantizeStochastic)
  // auto measures, at the first eligible allreduce of each dtype and size class, whether and how
  // to quantize on this link (plan/tuning.h); an explicit algorithm is never tuned over
  bool tune = true;
  // every shadow-th quantized allreduce (by the call's sequence number, alike on every rank) also
  // runs the exact allreduce of a copy of its input and records the error; 0: off
  int32_t shadow = 0;
  // quantize eligible reduce_scatter_tensor / reduce_scatter calls with the reduce codec, and
  // all_gather_into_tensor / all_gather calls with the gather codec; both off by default (an
  // all-gather changes what every rank computes with, a reduce-scatter only the sums)
  bool reduceScatter = false;
  bool allGather = false;
};

// Whether the codec rotates: rotate, or with rotate = -1 whether a phase has 4 bits (on a real
// model's activations 4-bit groups without the rotation lose far more: benchmarks/results/
// 04-smollm2-tensor-parallel.md). qcomm/config.py QuantConfig.rotates says the same.
bool rotates(const QuantConfig& c);

// Throws c10::ValueError naming the knob, the value given and what is allowed.
void validateConfig(const QuantConfig& c);

const char* algoName(int32_t algo);

}  // namespace qcomm
