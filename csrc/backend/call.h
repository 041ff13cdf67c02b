// Call: one collective as the backend takes it, and the one path every quantized collective goes
// through (allreduce, reduce-scatter, all-gather; tensor and list forms; host and CUDA tensors):
//
//   facts, gathered once at issue -> the plan, made once (makePlan, every gate inside) -> log ->
//   pass through, or: number the call -> host: queue -> [auto: the table's choice, tuner.h
//   decide, the one point where a call reads it] -> agree -> stage -> run the schedule -> finish
//   -> shadow -> count;  CUDA (call_cuda.cpp): agree -> stage -> launch -> finish -> count.
//
// The entry points of QncclBackend build a Call (what torch gave them, the inner backend's own
// call for the pass-through, and for list forms how to pack and unpack the message) and hand it
// to issueCall.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

#include "backend/group.h"
#include "backend/staging.h"
#include "plan/config.h"
#include "plan/plan.h"

namespace qcomm {

class Tuner;
class Transport;
struct CodecOps;
class CudaSide;

struct Call {
  int32_t collective = kAllreduce;  // plan.h Collective
  const char* name = "";            // torch's name: "all_reduce", "reduce_scatter_tensor", ...
  c10d::OpType type = c10d::OpType::UNKNOWN;
  // The message: the allreduce's tensor, the reduce-scatter's input (W shards), the all-gather's
  // output. The shard: the reduce-scatter's output, the all-gather's input (undefined for an
  // allreduce).
  at::Tensor message;
  at::Tensor shard;
  c10d::ReduceOp op;  // SUM for an all-gather
  std::chrono::milliseconds timeout{0};
  bool asyncOp = true;
  bool shapeOk = true;              // the list forms check their shapes themselves
  bool alike = true;                // the coalesced forms: their tensors can share one message
  std::vector<at::Tensor> inputs;   // what the profiler's record shows
  std::vector<at::Tensor> outputs;  // what the Work gives
  // the inner backend's own call (pass-through, and a class the tuner found exact faster)
  std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend*)> inner;
  // list forms: builds `message` (packing the inputs) once the call is to be quantized
  std::function<void(Call&)> pack;
  // list forms: after the quantized run, copies the message into the caller's tensors
  std::function<void(Call&)> unpack;
  // Set by issueCall: the group's config when the call was issued (a queued call is planned with
  // it, not with a config set since), the facts its plan was made from.
  QuantConfig config;
  CallFacts facts;
  // what keeps the group alive while the call is queued (the backend)
  c10::intrusive_ptr<c10d::Backend> owner;
};

// The buffers a quantized call runs on (stageCall): the message (the allreduce's tensor, the
// reduce-scatter's input, never written; the all-gather's output) and the reduce-scatter's output.
struct CallStage {
  Staged message;
  Staged shard;
  // the tensor the call's result is in (poisoned where a CUDA call gave up)
  at::Tensor& result();
};

// Whether t is sparse, complex, or (as torch.distributed.all_reduce hands complex tensors to
// backends: view_as_real(t)) a real view of a complex base: such calls pass through (DESIGN
// invariant 4).
bool complexOrSparse(const at::Tensor& t);
// `input` times the PREMUL_SUM factor of `op` (NCCL's meaning, where Gloo refuses PREMUL_SUM).
at::Tensor premultiplied(const at::Tensor& input, const c10d::ReduceOp& op);

// The facts of a call (the backend's plan diagnostics make them the same way).
CallFacts factsOf(const Group& g, const Call& call);

// The one entry of a collective: plans it (one makePlan), logs the decision, passes it through
// or runs it quantized; returns its Work.
c10::intrusive_ptr<c10d::Work> issueCall(Group& g, Tuner& tuner, CudaSide& cuda, Call call);

// A quantized host call, on the progress thread: agreement, the shadow's exact run, the staged
// run of the schedule, the copies back, stats. Returns the ranks' disagreement ("" when they
// agree and it ran). count false (the tuner's runs): no stats, no shadow.
std::string runHost(Group& g, const Plan& plan, Call& call, bool count = true);

// The buffers of a quantized call, staged before anything is exchanged (the caller's tensors, or
// contiguous or padded copies; the all-gather's input in its slot); host calls take a padded
// message's storage from `scratch`.
CallStage stageCall(const Group& g, const Plan& plan, const Call& call, Scratch* scratch);
// The schedule of the call on the staged buffers.
void runSchedule(const Plan& plan, CallStage& st, Transport& transport, CodecOps& ops,
                 Scratch* scratch);
// The result written into the caller's tensors (the copies back, the list forms' unpacking).
void finishCall(Call& call, CallStage& st);
// stats() of a quantized call that sent `wireBytes`.
void countCall(Group& g, const Plan& plan, const Call& call, int64_t wireBytes);

#ifdef QCOMM_WITH_CUDA
// A quantized call of CUDA tensors, planned and numbered (call_cuda.cpp).
c10::intrusive_ptr<c10d::Work> runCuda(Group& g, CudaSide& cuda, const Plan& plan, Call& call);
#endif

}  // namespace qcomm
