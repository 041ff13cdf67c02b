// QncclBackend's reduce-scatter and all-gather: one path for both (facts -> plan -> queue ->
// agree -> run the schedule -> write the caller's tensors), quantized for host tensors where the
// group's config opts in (QuantConfig.reduce_scatter / all_gather), passed through otherwise.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "algo/algorithms.h"
#include "backend/backend.h"
#include "backend/names.h"
#include "backend/staging.h"
#include "backend/work.h"
#include "codec/codec_ops.h"
#include "common/errors.h"
#include "common/settings.h"
#include "common/torch_dtype.h"
#include "transport/c10d_transport.h"

namespace qcomm {
namespace {

bool complexOrSparse(const at::Tensor& t) {
  const bool complexView = t.is_view() && t._base().is_complex();
  return t.is_sparse() || t.is_complex() || complexView || t.layout() != at::kStrided;
}

std::chrono::milliseconds timeoutOf(std::chrono::milliseconds opt,
                                    std::chrono::milliseconds group) {
  return opt == c10d::kUnsetTimeout ? group : opt;
}

// The storage of a rotated plan's padded message (plan.numel elements of t's dtype), from the
// group's scratch.
at::Tensor scratchMessage(Scratch& scratch, const Plan& plan, const at::Tensor& t) {
  return scratch.take(plan.numel * t.element_size(), t.options()).view(t.scalar_type());
}

// Gloo refuses PREMUL_SUM: a reduce-scatter that a group quantizing reduce-scatters passes
// through gives NCCL's meaning instead (each rank's input times the factor, then summed).
bool lowersPremul(const at::Tensor& t, const c10d::ReduceOp& op, bool reduceScatter) {
  return !t.is_cuda() && op.op_ == c10d::ReduceOp::PREMUL_SUM && reduceScatter;
}

// `input` times the PREMUL_SUM factor of `op`.
at::Tensor premultiplied(const at::Tensor& input, const c10d::ReduceOp& op) {
  const auto* s = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK_VALUE(s != nullptr, "[qcomm] PREMUL_SUM without its factor");
  return s->tensor_factor.defined() ? input.mul(s->tensor_factor) : input.mul(s->double_factor);
}

}  // namespace

Plan QncclBackend::planForSharded(int32_t collective, const at::Tensor& message,
                                  const at::Tensor& shard, c10d::ReduceOp op, bool shapeOk,
                                  bool useTable, const QuantConfig* config) const {
  const QuantConfig cfg = config != nullptr ? *config : getConfig();
  CallFacts f;
  f.collective = collective;
  f.world = getSize();
  f.numel = message.numel();
  f.dtype = dtypeOf(message.scalar_type());
  f.sparseOrComplex = complexOrSparse(message) || complexOrSparse(shard);
  f.shapeOk = shapeOk && shard.numel() * getSize() == message.numel() &&
              shard.scalar_type() == message.scalar_type() && shard.device() == message.device();
  if (collective == kAllGather) {
    f.opSum = true;
  } else {
    f.opSum = op.op_ == c10d::ReduceOp::SUM;
    f.opAvg = op.op_ == c10d::ReduceOp::AVG;
    if (op.op_ == c10d::ReduceOp::PREMUL_SUM) {
      f.opPremul = true;
      const auto* s = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      f.premulTensor = s == nullptr || s->tensor_factor.defined();
      if (s != nullptr) f.premulFactor = s->double_factor;
    }
  }
  Plan p;
  if (useTable && !message.is_cuda()) {
    std::lock_guard<std::mutex> lock(tuningMutex_);
    p = makePlan(f, cfg, &tuning_);
  } else {
    p = makePlan(f, cfg, nullptr);
  }
  if (disabled_) {
    p.quantize = false;
    p.reason = "QCOMM_DISABLE=1: every collective passes through";
  } else if (p.quantize && message.is_cuda()) {
#ifdef QCOMM_WITH_CUDA
    // opt-in, as the CUDA allreduce (backend.cpp planFor)
    if (!settings::flag("QCOMM_CUDA_QUANTIZE")) {
      p.quantize = false;
      p.reason = "CUDA tensor: quantizing CUDA collectives is opt-in (QCOMM_CUDA_QUANTIZE=1)";
    } else if (p.rotate) {
      // the per-shard padding and the rotation back of the reduce-scatter's output are built and
      // tested on host tensors only
      p.quantize = false;
      p.reason =
          "CUDA tensor: rotated reduce_scatter and all_gather run on host tensors only "
          "(rotate=False quantizes them)";
    }
#else
    p.quantize = false;
    p.reason = "CUDA tensor: qcomm was built without CUDA";
#endif
  }
  return p;
}

void QncclBackend::logSharded(const Plan& plan, const ShardedCall& call) {
  if (getRank() != 0 || settings::text("QCOMM_DEBUG") == "WARN") return;
  std::string what;
  if (plan.quantize) {
    const int bits = plan.collective == kReduceScatter ? plan.rs.bits : plan.ag.bits;
    what = std::string("quantized with ") +
           (plan.collective == kReduceScatter ? algoName(plan.algorithm) : "the gather phase") +
           " at " + std::to_string(bits) + " bits, groups of " + std::to_string(plan.rs.groupSize);
  } else {
    what = "passed through: " + plan.reason;
  }
  const std::string size =
      sizeClassName(call.message.numel() * int64_t(call.message.element_size()));
  const std::string dtype = dtypeName(call.message.scalar_type());
  {
    std::lock_guard<std::mutex> lock(logMutex_);
    if (!logged_.insert(std::string(call.name) + "/" + size + "/" + dtype + "/" + what).second) {
      return;
    }
  }
  std::fprintf(stderr, "%sINFO %s of %s (%s): %s\n", prefix().c_str(), call.name, size.c_str(),
               dtype.c_str(), what.c_str());
}

c10::intrusive_ptr<c10d::Work> QncclBackend::passThroughSharded(ShardedCall& call) {
  stats_.sharded[call.collective].passthroughCalls++;
  refuseOverlap(call.outputs, call.name);
  refuseOverlap({call.message}, call.name);
  return forward(pickAll({call.shard}, call.name), call.name, call.type, call.outputs, call.inner);
}

c10::intrusive_ptr<c10d::Work> QncclBackend::sharded(ShardedCall call) {
  TORCH_CHECK(!shutDown_, prefix(), call.name, ": the process group has been shut down");
  const at::NoGradGuard noGrad;  // results are written as Gloo writes them, outside autograd
  call.config = getConfig();
  const QuantConfig& cfg = call.config;
  Plan plan =
      planForSharded(call.collective, call.message, call.shard, call.op, call.shapeOk, false, &cfg);
  // auto with tune: the table's choice is read on the progress thread, where every rank reaches
  // the call at the same point (runTunedSharded, tuner.cpp), as the allreduce's
  plan.tuneNeeded = plan.quantize && cfg.algorithm == kAuto && cfg.tune && !call.message.is_cuda();
  if (!plan.tuneNeeded) logSharded(plan, call);
  if (!plan.quantize) return passThroughSharded(call);
  checkUsable(call.name);
  refuseOverlap({call.message, call.shard}, call.name);
  if (call.pack) call.pack(call);
  plan.callSeq = callSeq_++;
#ifdef QCOMM_WITH_CUDA
  if (call.message.is_cuda()) return shardedCuda(plan, call);
#endif
  const int bits = plan.collective == kReduceScatter ? plan.rs.bits : plan.ag.bits;
  const char* title =
      internTitle(std::string("qnccl:") + call.name + " " +
                  (plan.collective == kReduceScatter ? algoName(plan.algorithm) : "gather") + " " +
                  std::to_string(bits) + " g" + std::to_string(plan.rs.groupSize));
  auto work = c10::make_intrusive<QueuedWork>(getRank(), call.type, title,
                                              std::vector<at::Tensor>{call.shard}, call.outputs);
  work->setQueue(queue_.identity());
  auto self = c10::intrusive_ptr<QncclBackend>::reclaim_copy(this);
  const bool asyncOp = call.asyncOp;
  auto run = [self, plan, call, work]() mutable {
    const at::NoGradGuard noGrad;
    self->checkUsable(call.name);
    self->useCodecThreads();
    std::string mismatch;
    if (plan.tuneNeeded) {
      mismatch = self->runTunedSharded(plan, call);
    } else {
      self->guardTransport([&] { mismatch = self->runShardedCpu(plan, call); });
    }
    TORCH_CHECK(mismatch.empty(), self->prefix(), call.name,
                ": the ranks disagree on this call: ", mismatch,
                ". Every rank must pass the same shapes, dtype and op, and hold the same "
                "QuantConfig (qcomm.set_config on every rank).");
    work->complete();
  };
  return queueCall(std::move(run), work, asyncOp);
}

ShardedStage QncclBackend::stageSharded(const Plan& plan, const ShardedCall& call) const {
  const int64_t n = plan.userRowElems();  // the shard (a rotated plan pads it: runSharded)
  const int64_t own = int64_t(getRank()) * n;
  ShardedStage st;
  if (plan.collective == kReduceScatter) {
    st.message = Staged(call.message);
    st.shard = Staged(call.shard);
    const at::Tensor& in = st.message.data();
    const at::Tensor& out = st.shard.data();
    // In place (the output is this rank's own shard of the input) works as it is: each piece of
    // the own shard is read before its sum is written. Any other overlap runs on a copy.
    if (!st.shard.copied() && at::get_overlap_status(out, in) != at::MemOverlapStatus::No &&
        out.data_ptr() != in.reshape({-1}).narrow(0, own, n).data_ptr()) {
      st.message = Staged(in.clone());
    }
    return st;
  }
  st.message = Staged(call.message);
  at::Tensor flat = st.message.data().reshape({-1});
  at::Tensor slot = flat.narrow(0, own, n);
  // the input into this rank's slot, unless it already is that slot (FSDP2's all-gather)
  if (slot.data_ptr() != call.shard.data_ptr() || !call.shard.is_contiguous()) {
    at::Tensor src = call.shard.reshape({-1});
    if (at::get_overlap_status(src, flat) != at::MemOverlapStatus::No) src = src.clone();
    slot.copy_(src);
  }
  return st;
}

void QncclBackend::runSharded(const Plan& plan, ShardedCall& call, ShardedStage& st,
                              Transport& transport, CodecOps& ops, Scratch* scratch) {
  at::Tensor flat = st.message.data().reshape({-1});
  // a rotated plan: each shard zero-padded to whole groups (plan.numel elements in all)
  auto padded = [&] {
    at::Tensor storage = scratch != nullptr ? scratchMessage(*scratch, plan, flat)
                                            : at::empty({plan.numel}, flat.options());
    return paddedCopy(plan, flat, storage);
  };
  if (plan.collective == kReduceScatter) {
    at::Tensor flatOut = st.shard.data().reshape({-1});  // the shard's own elements only
    at::Tensor in = needsPadding(plan) ? padded() : flat;
    runReduceScatter(plan, transport, ops, in, flatOut, scratch);
    st.shard.finish();
  } else {
    if (needsPadding(plan)) {
      at::Tensor message = padded();
      runAllGather(plan, transport, ops, message, scratch);
      copyUnpadded(plan, message, flat);
    } else {
      runAllGather(plan, transport, ops, flat, scratch);
    }
    st.message.finish();
  }
  if (call.unpack) call.unpack(call);
}

void QncclBackend::countSharded(const Plan& plan, const ShardedCall& call, int64_t wireBytes) {
  const int64_t in = call.collective == kReduceScatter ? call.message.numel() : call.shard.numel();
  const int64_t inBytes = in * int64_t(call.message.element_size());
  stats_.quantizedCalls++;
  stats_.inputBytes += inBytes;
  stats_.wireBytes += wireBytes;
  CollectiveStats& s = stats_.sharded[plan.collective];
  s.quantizedCalls++;
  s.inputBytes += inBytes;
  s.wireBytes += wireBytes;
}

std::string QncclBackend::runShardedCpu(const Plan& plan, ShardedCall& call, bool count) {
  C10dTransport transport(gloo_.get(), getRank(), getSize(), call.timeout,
                          C10dTransport::kPointToPoint);
  transport.setCall(call.name);
  const std::string mismatch = agreeOnPlan(plan, transport);
  if (!mismatch.empty()) return mismatch;
  CpuCodecOps ops;
  std::lock_guard<std::mutex> lock(scratchMutex_);
  // shadow mode: the exact collective of copies first (an in-place call overwrites its input)
  const bool shadowed = count && plan.shadowed();
  const auto shadowStart = std::chrono::steady_clock::now();
  at::Tensor exact;
  if (shadowed) exact = exactOf(call);
  const double shadowSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - shadowStart).count();
  scratch_.begin();
  ShardedStage st = stageSharded(plan, call);
  runSharded(plan, call, st, transport, ops, &scratch_);
  scratchHeld_ = scratch_.bytesHeld();
  if (!count) return "";
  if (shadowed) {
    recordShadow(plan, plan.collective == kReduceScatter ? call.shard : call.message, exact,
                 shadowSeconds, collectiveName(plan.collective));
  }
  countSharded(plan, call, transport.bytesSent());
  return "";
}

at::Tensor QncclBackend::exactOf(const ShardedCall& call) {
  if (call.collective == kAllGather) {
    at::Tensor out = at::empty({call.message.numel()}, call.message.options());
    at::Tensor in = call.shard.reshape({-1}).clone();
    c10d::AllgatherOptions o;
    o.timeout = call.timeout;
    gloo_->_allgather_base(out, in, o)->wait();
    return out.view(call.message.sizes());
  }
  at::Tensor out = at::empty({call.shard.numel()}, call.shard.options());
  at::Tensor in = call.message.reshape({-1}).clone();
  c10d::ReduceScatterOptions o;
  o.timeout = call.timeout;
  o.reduceOp = call.op;
  if (call.op.op_ == c10d::ReduceOp::PREMUL_SUM) {  // Gloo refuses it: NCCL's meaning
    in = premultiplied(in, call.op);
    o.reduceOp = c10d::ReduceOp::SUM;
  }
  gloo_->_reduce_scatter_base(out, in, o)->wait();
  return out.view(call.shard.sizes());
}

// ---- the entry points ----

c10::intrusive_ptr<c10d::Work> QncclBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  ShardedCall c;
  c.collective = kReduceScatter;
  c.name = "reduce_scatter_tensor";
  c.type = c10d::OpType::_REDUCE_SCATTER_BASE;
  c.message = input;
  c.shard = output;
  c.op = opts.reduceOp;
  c.timeout = timeoutOf(opts.timeout, timeout_);
  c.asyncOp = opts.asyncOp;
  c.outputs = {output};
  const bool lower = lowersPremul(input, opts.reduceOp, getConfig().reduceScatter);
  c.inner = [=](c10d::Backend* b) mutable {
    if (!lower) return b->_reduce_scatter_base(output, input, opts);
    at::Tensor scaled = premultiplied(input, opts.reduceOp);
    c10d::ReduceScatterOptions o = opts;
    o.reduceOp = c10d::ReduceOp::SUM;
    return b->_reduce_scatter_base(output, scaled, o);
  };
  return sharded(std::move(c));
}

c10::intrusive_ptr<c10d::Work> QncclBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  refuseOverlap(inputs, "reduce_scatter");
  TORCH_CHECK(!outputs.empty(), prefix(), "reduce_scatter: no tensors given");
  ShardedCall c;
  c.collective = kReduceScatter;
  c.name = "reduce_scatter";
  c.type = c10d::OpType::REDUCE_SCATTER;
  c.shard = outputs[0];
  c.op = opts.reduceOp;
  c.timeout = timeoutOf(opts.timeout, timeout_);
  c.asyncOp = opts.asyncOp;
  c.outputs = outputs;
  // one output, W inputs like it: planned as the packed message, packed only if quantized
  bool ok = outputs.size() == 1 && inputs.size() == 1 && int(inputs[0].size()) == getSize();
  for (size_t j = 0; ok && j < inputs[0].size(); ++j) {
    const at::Tensor& x = inputs[0][j];
    ok = x.numel() == c.shard.numel() && x.scalar_type() == c.shard.scalar_type() &&
         x.device() == c.shard.device() && x.layout() == at::kStrided && !complexOrSparse(x);
  }
  c.shapeOk = ok;
  c.message = at::empty({0}, c.shard.options());
  if (ok) {
    c.message = at::empty({c.shard.numel() * getSize()}, c.shard.options());
    c.pack = [inputs](ShardedCall& call) {
      for (size_t j = 0; j < inputs[0].size(); ++j) {
        call.message.narrow(0, int64_t(j) * call.shard.numel(), call.shard.numel())
            .copy_(inputs[0][j].reshape({-1}));
      }
    };
  }
  const bool lower = lowersPremul(c.shard, opts.reduceOp, getConfig().reduceScatter);
  c.inner = [=](c10d::Backend* b) mutable {
    if (!lower) return b->reduce_scatter(outputs, inputs, opts);
    std::vector<std::vector<at::Tensor>> scaled(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      for (const at::Tensor& x : inputs[i]) scaled[i].push_back(premultiplied(x, opts.reduceOp));
    }
    c10d::ReduceScatterOptions o = opts;
    o.reduceOp = c10d::ReduceOp::SUM;
    return b->reduce_scatter(outputs, scaled, o);
  };
  return sharded(std::move(c));
}

c10::intrusive_ptr<c10d::Work> QncclBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  ShardedCall c;
  c.collective = kAllGather;
  c.name = "all_gather_into_tensor";
  c.type = c10d::OpType::_ALLGATHER_BASE;
  c.message = output;
  c.shard = input;
  c.timeout = timeoutOf(opts.timeout, timeout_);
  c.asyncOp = opts.asyncOp;
  c.outputs = {output};
  c.inner = [=](c10d::Backend* b) mutable { return b->_allgather_base(output, input, opts); };
  return sharded(std::move(c));
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  refuseOverlap(outputs, "allgather");
  TORCH_CHECK(!inputs.empty(), prefix(), "allgather: no tensors given");
  ShardedCall c;
  c.collective = kAllGather;
  c.name = "all_gather";
  c.type = c10d::OpType::ALLGATHER;
  c.shard = inputs[0];
  c.timeout = timeoutOf(opts.timeout, timeout_);
  c.asyncOp = opts.asyncOp;
  for (const auto& v : outputs) c.outputs.insert(c.outputs.end(), v.begin(), v.end());
  bool ok = inputs.size() == 1 && outputs.size() == 1 && int(outputs[0].size()) == getSize();
  for (size_t j = 0; ok && j < outputs[0].size(); ++j) {
    const at::Tensor& x = outputs[0][j];
    ok = x.numel() == c.shard.numel() && x.scalar_type() == c.shard.scalar_type() &&
         x.device() == c.shard.device() && x.layout() == at::kStrided && !complexOrSparse(x);
  }
  c.shapeOk = ok;
  c.message = at::empty({ok ? c.shard.numel() * getSize() : 0}, c.shard.options());
  if (ok) {
    c.unpack = [outputs](ShardedCall& call) {
      for (size_t j = 0; j < outputs[0].size(); ++j) {
        at::Tensor o = outputs[0][j];
        o.copy_(call.message.narrow(0, int64_t(j) * call.shard.numel(), call.shard.numel())
                    .view(o.sizes()));
      }
    };
  }
  c.inner = [=](c10d::Backend* b) mutable { return b->allgather(outputs, inputs, opts); };
  return sharded(std::move(c));
}

}  // namespace qcomm
