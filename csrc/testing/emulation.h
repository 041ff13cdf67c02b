// Helpers of the test hooks (testing.cpp, testing_fused.cpp): the plan of a CUDA-IPC call emulated
// on host memory.
#pragma once

#include <pybind11/pybind11.h>
#include <torch/extension.h>

#include <string>
#include <vector>

#include "plan/plan.h"
#include "python/codec.h"
#include "python/convert.h"

namespace qcomm {

// The plan of an emulated CUDA-IPC call: one contiguous CPU input (the message) and one equal
// uint8 buffer per rank (at least 2), a config that quantizes. With `separate` (the separate
// kernels, which run the schedules of every algorithm and rotate through CodecOps) any algorithm
// and rotation; else (the fused kernel) two_step only, no rotation. A reduce-scatter or all-gather
// (`collective`) takes its op by name ("sum", "avg", "premul" with `factor`).
inline Plan emulatedPlan(const char* what, const std::vector<at::Tensor>& inputs,
                         const std::vector<at::Tensor>& buffers, pybind11::object cfg, bool average,
                         uint32_t callSeq, bool separate = false, int32_t collective = kAllreduce,
                         const std::string& op = "", double factor = 1.0) {
  const int world = int(inputs.size());
  TORCH_CHECK_VALUE(world >= 2 && buffers.size() == inputs.size(), what,
                    ": one input and one buffer per rank, at least 2 ranks");
  const QuantConfig c = configFrom(cfg);
  CallFacts f;
  f.numel = inputs[0].numel();
  f.dtype = dtypeCode(inputs[0].scalar_type());
  f.opSum = !average;
  f.opAvg = average;
  f.world = world;
  if (collective != kAllreduce) {
    f.collective = collective;
    f.opSum = op == "sum";
    f.opAvg = op == "avg";
    f.opPremul = op == "premul";
    f.premulFactor = factor;
  }
  for (int r = 0; r < world; ++r) {
    TORCH_CHECK_VALUE(inputs[r].device().is_cpu() && inputs[r].is_contiguous() &&
                          inputs[r].numel() == f.numel &&
                          inputs[r].scalar_type() == inputs[0].scalar_type(),
                      what, ": contiguous CPU inputs of one dtype and numel");
    TORCH_CHECK_VALUE(buffers[r].scalar_type() == at::kByte && buffers[r].is_contiguous() &&
                          buffers[r].numel() == buffers[0].numel(),
                      what, ": equal contiguous uint8 buffers");
  }
  Plan plan = makePlan(f, c);
  TORCH_CHECK_VALUE(plan.quantize, what, ": the config must quantize");
  TORCH_CHECK_VALUE(separate || (plan.algorithm == kTwoStep && !plan.rotate), what,
                    ": the config must quantize with two_step, no rotation");
  plan.callSeq = callSeq;
  return plan;
}

}  // namespace qcomm
