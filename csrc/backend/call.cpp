// The one path of a quantized call (call.h): facts, plan, log, queue, agree, stage, run, finish,
// shadow, count. The CUDA form of the run is call_cuda.cpp's.
#include "backend/call.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "algo/algorithms.h"
#include "backend/cuda_side.h"
#include "backend/names.h"
#include "backend/tuner.h"
#include "backend/work.h"
#include "codec/codec_cpu.h"
#include "codec/codec_ops.h"
#include "common/settings.h"
#include "common/torch_dtype.h"
#include "transport/c10d_transport.h"

namespace qcomm {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The name torch's profiler and the pass-through's record give the call.
const char* recordName(const Call& call) {
  return std::string(call.name) == "allreduce" ? "all_reduce" : call.name;
}

// The op's facts: SUM, AVG, and a reduce-scatter's PREMUL_SUM (its factor on the host, or a
// tensor factor, which passes through).
void opFacts(const Call& call, CallFacts& f) {
  if (call.collective == kAllGather) {
    f.opSum = true;
    return;
  }
  f.opSum = call.op.op_ == c10d::ReduceOp::SUM;
  f.opAvg = call.op.op_ == c10d::ReduceOp::AVG;
  if (call.collective == kReduceScatter && call.op.op_ == c10d::ReduceOp::PREMUL_SUM) {
    f.opPremul = true;
    const auto* s = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(call.op.supplement_.get());
    f.premulTensor = s == nullptr || s->tensor_factor.defined();
    if (s != nullptr) f.premulFactor = s->double_factor;
  }
}

// The storage of a rotated plan's padded message (plan.numel elements of t's dtype), from the
// group's scratch.
at::Tensor scratchMessage(Scratch& scratch, const Plan& plan, const at::Tensor& t) {
  return scratch.take(plan.numel * t.element_size(), t.options()).view(t.scalar_type());
}

std::string bitsText(int b) { return b == 0 ? std::string("-") : std::to_string(b); }

// What the log and the profiler say a quantized plan runs.
std::string decisionOf(const Plan& plan, bool forLog) {
  const std::string gs = std::to_string(plan.rs.groupSize);
  if (plan.collective == kAllreduce) {
    auto bits = [forLog](int b) { return forLog && b == 0 ? std::string("none") : bitsText(b); };
    const std::string algo = plan.tuneNeeded ? "auto" : algoName(plan.algorithm);
    return forLog ? "quantized with " + algo + " " + bits(plan.rs.bits) + "/" + bits(plan.ag.bits) +
                        ", groups of " + gs
                  : algo + " " + bits(plan.rs.bits) + "/" + bits(plan.ag.bits) + " g" + gs;
  }
  const bool rs = plan.collective == kReduceScatter;
  const std::string bits = std::to_string(rs ? plan.rs.bits : plan.ag.bits);
  if (!forLog)
    return std::string(rs ? algoName(plan.algorithm) : "gather") + " " + bits + " g" + gs;
  return std::string("quantized with ") + (rs ? algoName(plan.algorithm) : "the gather phase") +
         " at " + bits + " bits, groups of " + gs;
}

constexpr int64_t kQuietCalls = 100;

// QCOMM_DEBUG=INFO, rank 0: the first call of each collective, size class and decision says what
// it does; after kQuietCalls eligible allreduces that all passed through, once, that none was
// quantized (and the last reason).
void logCall(Group& g, const Plan& plan, const Call& call) {
  if (g.rank != 0 || settings::text("QCOMM_DEBUG") == "WARN") return;
  const std::string what =
      plan.quantize ? decisionOf(plan, true) : "passed through: " + plan.reason;
  const at::Tensor& t = call.message;
  const std::string dtype = dtypeName(t.scalar_type());
  const std::string size = sizeClassName(t.numel() * int64_t(t.element_size()));
  const bool allreduce = call.collective == kAllreduce;
  std::string quiet;
  bool fresh = false;
  {
    std::lock_guard<std::mutex> lock(g.logMutex);
    const bool eligible = allreduce && dtypeOf(t.scalar_type()) >= 0 &&
                          t.layout() == at::kStrided && !t.is_complex() &&
                          (call.facts.opSum || call.facts.opAvg);
    if (eligible) ++g.eligibleCalls;
    const QuantConfig& c = call.config;
    const bool asks = !g.disabled && c.algorithm != kAlgoNone && (c.rsBits || c.agBits);
    if (eligible && asks && !g.quietLogged && g.eligibleCalls >= kQuietCalls &&
        g.stats.quantizedCalls.load() == 0 && !plan.quantize) {
      g.quietLogged = true;
      quiet = std::to_string(kQuietCalls) +
              " allreduces of fp32, fp16 or bf16 tensors on this group, none of them quantized; "
              "the last passed through: " +
              plan.reason + " (min_bytes " + std::to_string(c.minBytes) + ")";
    }
    const std::string key = std::string(call.name) + "/" + size + "/" + dtype;
    fresh = g.logged.insert(key + "/" + what).second;
  }
  if (!quiet.empty()) {
    std::fprintf(stderr, "%sINFO allreduce: %s\n", g.prefix().c_str(), quiet.c_str());
  }
  if (!fresh) return;
  std::fprintf(stderr, "%sINFO %s of %s (%s): %s\n", g.prefix().c_str(), call.name, size.c_str(),
               dtype.c_str(), what.c_str());
}

// A call that passes through: counted, checked, forwarded to the inner backend.
c10::intrusive_ptr<c10d::Work> passThrough(Group& g, Call& call) {
  g.stats.byCollective[call.collective].passthroughCalls++;
  if (call.collective != kAllreduce) {
    std::vector<at::Tensor> written = call.outputs;
    written.push_back(call.message);
    return g.passThrough(call.name, call.type, {call.shard}, written, call.outputs, call.inner);
  }
  return g.forward(g.pickAll(call.inputs, call.name), recordName(call), call.type, call.outputs,
                   call.inner);
}

// |q - e| over the elements whose exact value e is finite, in float64, a slice at a time (so the
// comparison never holds more than a few MiB of doubles): the squared norms and the largest |d|.
// A q that is not finite where e is counts as an infinite error.
void compareSlices(const at::Tensor& q, const at::Tensor& e, double* diff2, double* exact2,
                   double* maxAbs) {
  const at::Tensor qf = q.reshape({-1}), ef = e.reshape({-1});
  const int64_t n = qf.numel(), step = int64_t(1) << 20;
  for (int64_t b = 0; b < n; b += step) {
    const int64_t len = std::min(step, n - b);
    const at::Tensor ed = ef.narrow(0, b, len).to(at::kDouble);
    const at::Tensor finite = at::isfinite(ed);
    const at::Tensor d = (qf.narrow(0, b, len).to(at::kDouble) - ed).masked_fill(~finite, 0.0);
    const at::Tensor d2 = d.nan_to_num(INFINITY, INFINITY, INFINITY);
    *diff2 += (d2 * d2).sum().item<double>();
    *exact2 += (ed.masked_fill(~finite, 0.0).pow(2)).sum().item<double>();
    *maxAbs = std::max(*maxAbs, d2.abs().max().item<double>());
  }
}

// The tensor a call's result is in: the allreduce's and all-gather's message, the
// reduce-scatter's shard.
const at::Tensor& resultOf(const Call& call) {
  return call.collective == kReduceScatter ? call.shard : call.message;
}

// Shadow mode: the inner backend's exact result of the call, on copies of its input (an in-place
// call overwrites its input).
at::Tensor exactOf(Group& g, const Plan& plan, const Call& call) {
  if (call.collective == kAllreduce) {
    at::Tensor exact = call.message.contiguous().clone();
    std::vector<at::Tensor> ts{exact};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = call.timeout;
    g.gloo->allreduce(ts, o)->wait();
    if (plan.average) exact.div_(g.size);
    return exact;
  }
  if (call.collective == kAllGather) {
    at::Tensor out = at::empty({call.message.numel()}, call.message.options());
    at::Tensor in = call.shard.reshape({-1}).clone();
    c10d::AllgatherOptions o;
    o.timeout = call.timeout;
    g.gloo->_allgather_base(out, in, o)->wait();
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
  g.gloo->_reduce_scatter_base(out, in, o)->wait();
  return out.view(call.shard.sizes());
}

// Shadow mode: records the error of the call's result against `exact`, keyed "<dtype> <size
// class>" (prefixed with the collective for calls other than allreduces).
void recordShadow(Group& g, const Call& call, const at::Tensor& exact, double exactSeconds) {
  const Clock::time_point start = Clock::now();
  const at::Tensor& result = resultOf(call);
  double diff2 = 0, exact2 = 0, maxAbs = 0;
  if (result.numel() > 0) compareSlices(result, exact, &diff2, &exact2, &maxAbs);
  const double rel = exact2 > 0 ? std::sqrt(diff2 / exact2) : (diff2 > 0 ? double(INFINITY) : 0.0);
  const std::string key =
      (call.collective == kAllreduce ? "" : std::string(collectiveName(call.collective)) + " ") +
      dtypeName(result.scalar_type()) + " " +
      sizeClassName(result.numel() * int64_t(result.element_size()));
  const double took = exactSeconds + secondsSince(start);
  std::lock_guard<std::mutex> lock(g.shadowMutex);
  ShadowStat& s = g.shadow[key];
  s.calls++;
  s.relL2Sum += rel;
  s.relL2Max = std::max(s.relL2Max, rel);
  s.maxAbs = std::max(s.maxAbs, maxAbs);
  s.seconds += took;
}

// On the progress thread: a quantized host call. With `tableDecides` (auto) the tuner's table
// gives the plan first; a class tuned to exact runs the inner collective.
void runQueued(Group& g, Tuner& tuner, Plan plan, Call& call, bool tableDecides) {
  const at::NoGradGuard noGrad;  // grad mode is per thread: the copy-back stays out of autograd
  g.checkUsable(call.name);
  g.useCodecThreads();
  const Clock::time_point start = Clock::now();
  // a list form's message is packed once the call quantizes: a class the tuner found exact
  // faster runs the inner call on the caller's tensors, with no copy; but a class the tuner may
  // measure now is measured on the packed message
  bool packed = false;
  auto pack = [&] {
    if (call.pack && !packed) call.pack(call);
    packed = true;
  };
  if (tableDecides) {
    if (call.config.tune) pack();
    const uint32_t seq = plan.callSeq;
    plan =
        tuner.decide(plan, call.facts, call.config, call.message, call.timeout, call.config.tune);
    plan.callSeq = seq;
    logCall(g, plan, call);
  }
  std::string mismatch;
  if (plan.quantize) {
    pack();
    g.guardTransport([&] { mismatch = runHost(g, plan, call); });
  } else {
    // tuned: the exact call measured faster. Gloo's refusal of it (an argument error) is the
    // call's error alone: nothing of ours was on the wire, and the group stays usable
    g.stats.passthroughCalls++;
    g.stats.byCollective[call.collective].passthroughCalls++;
    c10::intrusive_ptr<c10d::Work> w = call.inner(g.gloo.get());
    if (w) w->wait();
  }
  if (tableDecides && call.config.tune) tuner.noteCallTime(call.facts, secondsSince(start));
  // every rank saw the same headers and raises here, so the group stays usable
  g.requireAgreement(mismatch, call.name, call.collective);
}

}  // namespace

bool complexOrSparse(const at::Tensor& t) {
  const bool complexView = t.is_view() && t._base().is_complex();
  return t.is_sparse() || t.is_complex() || complexView || t.layout() != at::kStrided;
}

// `input` times the PREMUL_SUM factor of `op`.
at::Tensor premultiplied(const at::Tensor& input, const c10d::ReduceOp& op) {
  const auto* s = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK_VALUE(s != nullptr, "[qcomm] PREMUL_SUM without its factor");
  return s->tensor_factor.defined() ? input.mul(s->tensor_factor) : input.mul(s->double_factor);
}

at::Tensor& CallStage::result() { return shard.user().defined() ? shard.data() : message.data(); }

CallFacts factsOf(const Group& g, const Call& call) {
  CallFacts f;
  f.collective = call.collective;
  f.world = g.size;
  f.numel = call.message.numel();
  f.dtype = dtypeOf(call.message.scalar_type());
  const bool sharded = call.collective != kAllreduce;
  f.sparseOrComplex = complexOrSparse(call.message) || (sharded && complexOrSparse(call.shard));
  if (sharded) {
    const at::Tensor &m = call.message, &s = call.shard;
    f.shapeOk = call.shapeOk && s.numel() * g.size == m.numel() &&
                s.scalar_type() == m.scalar_type() && s.device() == m.device();
  }
  opFacts(call, f);
  f.alike = call.alike;
  f.disabled = g.disabled;
  f.cuda = call.message.is_cuda();
#ifdef QCOMM_WITH_CUDA
  f.cudaBuilt = true;
#endif
  // Opt-in until the CUDA transports have run on a GPU (README, "CUDA tensors"): by default a
  // CUDA call stays NCCL's, exactly.
  f.cudaOptIn = f.cuda && settings::flag("QCOMM_CUDA_QUANTIZE");
  return f;
}

c10::intrusive_ptr<c10d::Work> issueCall(Group& g, Tuner& tuner, CudaSide& cuda, Call call) {
  g.checkOpen(call.name);
  // the result is written into the caller's tensors as Gloo and NCCL write them, outside autograd
  const at::NoGradGuard noGrad;
  call.config = g.config();
  call.facts = factsOf(g, call);
  Plan plan = makePlan(call.facts, call.config);
  // auto, host memory: what the table says is read on the progress thread (runQueued), where
  // every rank reaches this call at the same point of the same sequence; at issue a rank may or
  // may not yet see the choice of an earlier call's measurement. Logged once decided.
  const bool tableDecides = plan.quantize && !call.facts.cuda && call.config.algorithm == kAuto;
  // the profiler's record says "auto" where the tuner may measure the class first
  plan.tuneNeeded = tableDecides && call.config.tune;
  if (!tableDecides) logCall(g, plan, call);
  if (!plan.quantize) return passThrough(g, call);
  g.checkUsable(call.name);
  if (call.collective != kAllreduce) g.refuseOverlap({call.message, call.shard}, call.name);
  // counted for every call the config quantizes, a class tuned to exact too: the number is a
  // function of the calls issued, not of when this rank read the table
  plan.callSeq = g.callSeq++;
#ifdef QCOMM_WITH_CUDA
  if (call.facts.cuda) {
    if (call.pack) call.pack(call);  // on the caller's stream, where the inputs are ready
    return runCuda(g, cuda, plan, call);
  }
#else
  (void)cuda;
#endif
  const char* title =
      internTitle(std::string("qnccl:") + recordName(call) + " " + decisionOf(plan, false));
  auto work = g.queuedWork(call.type, title, call.inputs, call.outputs);
  const bool asyncOp = call.asyncOp;
  // the task holds the backend (call.owner), so that a group dropped with calls queued lives
  // until they ran
  auto run = [&g, &tuner, plan, call = std::move(call), work, tableDecides]() mutable {
    runQueued(g, tuner, plan, call, tableDecides);
    work->complete();
  };
  return g.queueCall(std::move(run), work, asyncOp);
}

std::string runHost(Group& g, const Plan& plan, Call& call, bool count) {
  C10dTransport transport(g.gloo.get(), g.rank, g.size, call.timeout, C10dTransport::kPointToPoint);
  transport.setCall(call.name);
  const std::string mismatch = g.agree(plan, transport);
  if (!mismatch.empty()) return mismatch;
  CpuCodecOps ops;
  std::lock_guard<std::mutex> lock(g.scratchMutex);
  // shadow mode: the exact collective of copies first (every rank shadows the same calls: the
  // plan's header carries the setting and callSeq is counted alike)
  const bool shadowed = count && plan.shadowed();
  const Clock::time_point shadowStart = Clock::now();
  at::Tensor exact;
  if (shadowed) exact = exactOf(g, plan, call);
  const double shadowSeconds = secondsSince(shadowStart);
  g.scratch.begin();
  CallStage st = stageCall(g, plan, call, &g.scratch);
  runSchedule(plan, st, transport, ops, &g.scratch);
  finishCall(call, st);
  g.scratchHeld = g.scratch.bytesHeld();
  if (!count) return "";
  if (shadowed) recordShadow(g, call, exact, shadowSeconds);
  countCall(g, plan, call, transport.bytesSent());
  return "";
}

CallStage stageCall(const Group& g, const Plan& plan, const Call& call, Scratch* scratch) {
  CallStage st;
  if (call.collective == kAllreduce) {
    // the tensor itself, or its contiguous copy, or (a rotated message that ends inside a
    // group) its copy padded with zeros to whole groups, in the group's kept buffers for a host
    // call
    at::Tensor storage;
    if (scratch != nullptr && needsPadding(plan)) {
      storage = scratchMessage(*scratch, plan, call.message);
    }
    st.message = Staged(plan, call.message, storage);
    return st;
  }
  const int64_t n = plan.userRowElems();  // the shard (a rotated plan pads it: runSchedule)
  const int64_t own = int64_t(g.rank) * n;
  st.message = Staged(call.message);
  if (plan.collective == kReduceScatter) {
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

void runSchedule(const Plan& plan, CallStage& st, Transport& transport, CodecOps& ops,
                 Scratch* scratch) {
  if (plan.collective == kAllreduce) {
    runAllreduce(plan, transport, ops, st.message.data(), scratch);
    return;
  }
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
  } else if (needsPadding(plan)) {
    at::Tensor message = padded();
    runAllGather(plan, transport, ops, message, scratch);
    copyUnpadded(plan, message, flat);
  } else {
    runAllGather(plan, transport, ops, flat, scratch);
  }
}

void finishCall(Call& call, CallStage& st) {
  if (call.collective == kReduceScatter) {
    st.shard.finish();
  } else {
    st.message.finish();
  }
  if (call.unpack) call.unpack(call);
}

void countCall(Group& g, const Plan& plan, const Call& call, int64_t wireBytes) {
  const at::Tensor& input = call.collective == kAllGather ? call.shard : call.message;
  const int64_t inBytes = input.numel() * int64_t(input.element_size());
  g.stats.quantizedCalls++;
  g.stats.inputBytes += inBytes;
  g.stats.wireBytes += wireBytes;
  CollectiveStats& s = g.stats.byCollective[plan.collective];
  s.quantizedCalls++;
  s.inputBytes += inBytes;
  s.wireBytes += wireBytes;
}

}  // namespace qcomm
