// runAllreduce, runReduceScatter, runAllGather (algorithms.h): check the call, run its schedule,
// and name the step that failed.
#include <c10/util/Exception.h>

#include "algo/algorithms.h"
#include "algo/schedule.h"
#include "common/errors.h"
#include "common/torch_dtype.h"

namespace qcomm {
namespace algo {
void twoStep(Call& c);   // two_step.cpp
void ring(Call& c);      // ring.cpp
void semiRing(Call& c);  // semi_ring.cpp
}  // namespace algo

namespace {

// Runs `schedule` on the call and names the step that failed in any error it raises.
template <typename F>
void runChecked(const std::string& where, algo::Call& c, Transport& t, F&& schedule) {
  try {
    schedule();
    c.step = "the transfers still in flight";
    t.finish();
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    if (msg.rfind("[qcomm rank", 0) == 0) throw;  // a transport error already says it all
    TORCH_CHECK(false, where, c.step, " failed: ", msg);
  } catch (const std::exception& e) {  // a codec kernel's launch, the IPC exchange's executor
    const std::string msg = e.what();
    if (msg.rfind("[qcomm rank", 0) == 0) throw;
    TORCH_CHECK(false, where, c.step, " failed: ", msg);
  }
}

// The checks every entry point makes of the plan, the transport and the message.
void checkCall(const std::string& where, const Plan& plan, int32_t collective, Transport& t,
               const at::Tensor& data) {
  TORCH_CHECK_VALUE(plan.quantize, where, "the plan passes through (", plan.reason, ")");
  TORCH_CHECK_VALUE(plan.collective == collective, where, "a plan for ",
                    collectiveName(plan.collective));
  TORCH_CHECK_VALUE(t.world() == plan.world, where, "a plan for ", plan.world,
                    " ranks over a transport of ", t.world());
  TORCH_CHECK_VALUE(data.is_contiguous() && data.numel() == plan.numel &&
                        dtypeOf(data.scalar_type()) == plan.dtype,
                    where, "expected a contiguous tensor of ", plan.numel,
                    " elements of the plan's dtype, got ", data.sizes(), " ", data.scalar_type());
}

void runSchedule(algo::Call& c) {
  switch (c.plan.algorithm) {
    case kTwoStep:
      algo::twoStep(c);
      break;
    case kRing:
      algo::ring(c);
      break;
    case kSemiRing:
      algo::semiRing(c);
      break;
    default:
      TORCH_CHECK(false, "unknown algorithm ", c.plan.algorithm);
  }
}

}  // namespace

void runAllreduce(const Plan& plan, Transport& t, CodecOps& ops, at::Tensor& data,
                  Scratch* scratch) {
  const std::string where = rankPrefix(t.rank(), plan.world) + "allreduce: ";
  checkCall(where, plan, kAllreduce, t, data);
  algo::Call c(plan, t, ops, data, scratch);
  runChecked(where, c, t, [&] { runSchedule(c); });
}

void runReduceScatter(const Plan& plan, Transport& t, CodecOps& ops, at::Tensor& input,
                      at::Tensor& output, Scratch* scratch) {
  const std::string where = rankPrefix(t.rank(), plan.world) + "reduce_scatter: ";
  checkCall(where, plan, kReduceScatter, t, input);
  TORCH_CHECK_VALUE(output.is_contiguous() && output.numel() == plan.userRowElems() &&
                        output.scalar_type() == input.scalar_type(),
                    where, "expected a contiguous output of ", plan.userRowElems(),
                    " elements of the input's dtype, got ", output.sizes(), " ",
                    output.scalar_type());
  algo::Call c(plan, t, ops, input, scratch, &output);
  runChecked(where, c, t, [&] { runSchedule(c); });
}

void runAllGather(const Plan& plan, Transport& t, CodecOps& ops, at::Tensor& data,
                  Scratch* scratch) {
  const std::string where = rankPrefix(t.rank(), plan.world) + "all_gather: ";
  checkCall(where, plan, kAllGather, t, data);
  algo::Call c(plan, t, ops, data, scratch);
  runChecked(where, c, t, [&] { algo::allGather(c); });
}

at::Tensor paddedCopy(const Plan& plan, const at::Tensor& t, at::Tensor storage) {
  TORCH_CHECK_VALUE(t.numel() == plan.userNumel, "paddedCopy: a tensor of ", t.numel(),
                    " elements for a plan of ", plan.userNumel);
  at::Tensor out = storage.defined() ? storage : at::empty({plan.numel}, t.options());
  const int64_t rows = plan.rows, row = plan.userRowElems(), padded = plan.numel / rows;
  at::Tensor grid = out.view({rows, padded});
  grid.narrow(1, 0, row).copy_(t.reshape({rows, row}));
  grid.narrow(1, row, padded - row).zero_();
  return out;
}

void copyUnpadded(const Plan& plan, const at::Tensor& padded, at::Tensor& t) {
  const int64_t rows = plan.rows, row = plan.userRowElems();
  t.copy_(padded.view({rows, plan.numel / rows}).narrow(1, 0, row).reshape(t.sizes()));
}

}  // namespace qcomm
