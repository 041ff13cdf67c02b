// QncclBackend: routing (a Call for the collectives that may quantize, pass-through for the
// rest), the lifecycle, and the few operations on the group as a whole (config, tune).
#include "backend/backend.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <memory>

#include "backend/work.h"
#include "common/errors.h"

namespace qcomm {
namespace {

std::atomic<int64_t> liveBackends{0};

std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& ts) {
  std::vector<at::Tensor> out;
  for (const auto& v : ts) out.insert(out.end(), v.begin(), v.end());
  return out;
}

// Whether the list form's W tensors are each like `shard` (its numel, dtype and device, dense):
// then it is planned as the packed message.
bool likeShard(const std::vector<at::Tensor>& ts, const at::Tensor& shard) {
  for (const at::Tensor& x : ts) {
    if (x.numel() != shard.numel() || x.scalar_type() != shard.scalar_type() ||
        x.device() != shard.device() || x.layout() != at::kStrided || complexOrSparse(x)) {
      return false;
    }
  }
  return true;
}

// Whether `ts` are one dtype and device, and dense (a coalesced call's tensors).
bool alikeAll(const std::vector<at::Tensor>& ts) {
  for (const at::Tensor& t : ts) {
    if (t.scalar_type() != ts[0].scalar_type() || t.device() != ts[0].device() ||
        t.layout() != at::kStrided) {
      return false;
    }
  }
  return true;
}

// A sharded coalesced call's tensors: all alike, and each of `full` W times its `part`.
bool alikeSharded(const std::vector<at::Tensor>& full, const std::vector<at::Tensor>& part,
                  int world) {
  std::vector<at::Tensor> all = full;
  all.insert(all.end(), part.begin(), part.end());
  if (!alikeAll(all)) return false;
  for (size_t i = 0; i < full.size(); ++i) {
    if (full[i].numel() != part[i].numel() * world) return false;
  }
  return true;
}

int64_t numelOf(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (const at::Tensor& t : ts) n += t.numel();
  return n;
}

// A packed message of `rows` rows: row r holds, side by side, row r of each tensor (its r-th
// 1/rows of elements). packRows fills `packed` from the tensors, unpackRows the tensors from it.
void packRows(at::Tensor& packed, const std::vector<at::Tensor>& ts, int rows) {
  const int64_t rowLen = packed.numel() / rows;
  int64_t off = 0;
  for (const at::Tensor& t : ts) {
    const int64_t n = t.numel() / rows;
    const at::Tensor flat = t.reshape({-1});
    for (int r = 0; r < rows; ++r) {
      packed.narrow(0, r * rowLen + off, n).copy_(flat.narrow(0, r * n, n));
    }
    off += n;
  }
}

void unpackRows(const at::Tensor& packed, const std::vector<at::Tensor>& ts, int rows) {
  const int64_t rowLen = packed.numel() / rows;
  int64_t off = 0;
  for (at::Tensor t : ts) {
    const int64_t n = t.numel() / rows;
    at::Tensor flat = t.is_contiguous() ? t.view({-1}) : at::empty({t.numel()}, t.options());
    for (int r = 0; r < rows; ++r) {
      flat.narrow(0, r * n, n).copy_(packed.narrow(0, r * rowLen + off, n));
    }
    if (!t.is_contiguous()) t.copy_(flat.view(t.sizes()));
    off += n;
  }
}

// The list forms (reduce_scatter, allgather): `parts` (one tensor per input, the shards) and
// `lists` (for each, W tensors: one per rank). The message has W rows; row r holds, side by
// side, tensor r of every list. ok: each list has W tensors like its part, all of one dtype and
// device (alike), so that the call is one packed message of `total` elements a row.
struct ListLayout {
  bool ok = false;
  bool alike = true;
  int64_t total = 0;
  int world = 0;
};

ListLayout listLayout(const std::vector<at::Tensor>& parts,
                      const std::vector<std::vector<at::Tensor>>& lists, int world) {
  ListLayout l;
  l.world = world;
  l.alike = alikeAll(parts);
  l.ok = l.alike && parts.size() == lists.size();
  for (size_t i = 0; l.ok && i < parts.size(); ++i) {
    l.ok = int(lists[i].size()) == world && likeShard(lists[i], parts[i]);
    l.total += parts[i].numel();
  }
  return l;
}

void packLists(at::Tensor& message, const std::vector<std::vector<at::Tensor>>& lists,
               const ListLayout& l) {
  for (int r = 0; r < l.world; ++r) {
    int64_t off = int64_t(r) * l.total;
    for (const std::vector<at::Tensor>& list : lists) {
      const int64_t n = list[r].numel();
      message.narrow(0, off, n).copy_(list[r].reshape({-1}));
      off += n;
    }
  }
}

void unpackLists(const at::Tensor& message, const std::vector<std::vector<at::Tensor>>& lists,
                 const ListLayout& l) {
  for (int r = 0; r < l.world; ++r) {
    int64_t off = int64_t(r) * l.total;
    for (const std::vector<at::Tensor>& list : lists) {
      at::Tensor o = list[r];
      o.copy_(message.narrow(0, off, o.numel()).view(o.sizes()));
      off += o.numel();
    }
  }
}

// Gloo refuses PREMUL_SUM: a reduce-scatter that a group quantizing reduce-scatters passes
// through gives NCCL's meaning instead (each rank's input times the factor, then summed).
bool lowersPremul(const at::Tensor& t, const c10d::ReduceOp& op, bool reduceScatter) {
  return !t.is_cuda() && op.op_ == c10d::ReduceOp::PREMUL_SUM && reduceScatter;
}

}  // namespace

int64_t QncclBackend::liveCount() { return liveBackends.load(); }

QncclBackend::QncclBackend(int rank, int size, std::chrono::milliseconds timeout,
                           c10::intrusive_ptr<c10d::Backend> gloo,
                           c10::intrusive_ptr<c10d::Backend> nccl, const QuantConfig& config,
                           c10::intrusive_ptr<c10d::Store> store, bool disabled, int cpuThreads,
                           int checkCalls)
    : c10d::Backend(rank, size),
      group_(rank, size, timeout, std::move(gloo), std::move(nccl), std::move(store), config,
             disabled, cpuThreads, checkCalls) {
  init();
  liveBackends.fetch_add(1);
}

QncclBackend::~QncclBackend() {
  group_.stop(std::chrono::milliseconds(0), group_.prefix() + "the group was destroyed");
  liveBackends.fetch_sub(1);
}

void QncclBackend::setConfig(const QuantConfig& config) {
  const QuantConfig before = group_.config();
  group_.setConfig(config);  // validates it first
  // the table was measured with other bits, groups or min_bytes: it no longer says what is
  // fastest, and the cache file is keyed by the config the group was created with
  if (!sameTuningKey(before, config)) tuner_.forget();
}

Call QncclBackend::callOf(int32_t collective, const char* name, c10d::OpType type,
                          const at::Tensor& message, const at::Tensor& shard, c10d::ReduceOp op,
                          std::chrono::milliseconds timeout, bool asyncOp) const {
  Call c;
  c.collective = collective;
  c.name = name;
  c.type = type;
  c.message = message;
  c.shard = shard;
  c.op = op;
  c.timeout = group_.timeoutOf(timeout);
  c.asyncOp = asyncOp;
  return c;
}

c10::intrusive_ptr<c10d::Work> QncclBackend::issue(Call call) {
  call.owner = c10::intrusive_ptr<c10d::Backend>::reclaim_copy(this);
  return issueCall(group_, tuner_, cuda_, std::move(call));
}

Plan QncclBackend::plan(int32_t collective, const at::Tensor& message, const at::Tensor& shard,
                        c10d::ReduceOp op, bool alike) const {
  Call c = callOf(collective, "plan", c10d::OpType::UNKNOWN, message, shard, op,
                  c10d::kUnsetTimeout, false);
  c.alike = alike;
  return tuner_.peek(factsOf(group_, c), group_.config());
}

void QncclBackend::tune(const at::Tensor& sample, int32_t collective) {
  group_.checkOpen("tune");
  group_.checkUsable("tune");
  TORCH_CHECK_VALUE(sample.device().is_cpu(), group_.prefix(), "tune: the tuner measures ",
                    "host-memory calls only; a CUDA call with algorithm='auto' runs two_step (got "
                    "a tensor on ",
                    sample.device(), ")");
  TORCH_CHECK_VALUE(!group_.disabled, group_.prefix(),
                    "tune: QCOMM_DISABLE=1: every collective passes through");
  const QuantConfig cfg = group_.config();
  TORCH_CHECK_VALUE(cfg.algorithm == kAuto, group_.prefix(), "tune: the group's algorithm is ",
                    algoName(cfg.algorithm),
                    ", chosen explicitly; the tuner chooses only for algorithm='auto'");
  TORCH_CHECK_VALUE(collective >= kAllreduce && collective <= kAllGather, group_.prefix(),
                    "tune: unknown collective ", collective);
  const int64_t n = sample.numel() / getSize();
  TORCH_CHECK_VALUE(collective == kAllreduce || n * getSize() == sample.numel(), group_.prefix(),
                    "tune: a ", collectiveName(collective), " message of ", sample.numel(),
                    " elements is not ", getSize(), " shards alike");
  at::Tensor shard;
  if (collective != kAllreduce) shard = sample.reshape({-1}).narrow(0, 0, n);
  const Call c = callOf(collective, "tune", c10d::OpType::UNKNOWN, sample, shard,
                        c10d::ReduceOp::SUM, c10d::kUnsetTimeout, false);
  const Plan plan = makePlan(factsOf(group_, c), cfg);
  TORCH_CHECK_VALUE(plan.quantize, group_.prefix(), "tune: ",
                    collective == kAllreduce ? std::string("an allreduce")
                                             : std::string("a ") + collectiveName(collective),
                    " of ", sample.numel(), " ", sample.scalar_type(), " elements passes through (",
                    plan.reason, "); there is nothing to tune");
  auto work = group_.queuedWork(c10d::OpType::ALLREDUCE, "qnccl:tune", {}, {});
  at::Tensor copy = sample.detach();
  // the caller waits: the task's references stay valid
  group_.queueCall(
      [this, &plan, copy, work] {
        tuner_.measure(plan, copy, group_.timeout, false);
        work->complete();
      },
      work, false);
}

// ---- the collectives a Call takes ----

c10::intrusive_ptr<c10d::Work> QncclBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(!tensors.empty(), group_.prefix(), "allreduce: no tensors given");
  auto inner = [=](c10d::Backend* b) mutable { return b->allreduce(tensors, opts); };
  if (tensors.size() != 1) {  // Gloo's sum over every tensor of every rank: not ours to pack
    group_.stats.byCollective[kAllreduce].passthroughCalls++;
    return group_.forward(group_.pickAll(tensors, "allreduce"), "all_reduce",
                          c10d::OpType::ALLREDUCE, tensors, inner);
  }
  const at::Tensor& t = tensors[0];
  group_.checkOpen("allreduce");
  TORCH_CHECK_VALUE(t.device().is_cpu() || t.is_cuda(), group_.prefix(), "allreduce: tensors on ",
                    t.device(), " are not supported; qnccl takes CPU and CUDA tensors");
  group_.refuseOverlap(tensors, "allreduce");
  Call c = callOf(kAllreduce, "allreduce", c10d::OpType::ALLREDUCE, t, at::Tensor(), opts.reduceOp,
                  opts.timeout, opts.asyncOp);
  c.inputs = tensors;
  c.outputs = tensors;
  c.inner = inner;
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> QncclBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  Call c = callOf(kReduceScatter, "reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE,
                  input, output, opts.reduceOp, opts.timeout, opts.asyncOp);
  c.inputs = {input};
  c.outputs = {output};
  const bool lower = lowersPremul(input, opts.reduceOp, group_.config().reduceScatter);
  c.inner = [=](c10d::Backend* b) mutable {
    if (!lower) return b->_reduce_scatter_base(output, input, opts);
    at::Tensor scaled = premultiplied(input, opts.reduceOp);
    c10d::ReduceScatterOptions o = opts;
    o.reduceOp = c10d::ReduceOp::SUM;
    return b->_reduce_scatter_base(output, scaled, o);
  };
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> QncclBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  group_.refuseOverlap(inputs, "reduce_scatter");
  TORCH_CHECK(!outputs.empty(), group_.prefix(), "reduce_scatter: no tensors given");
  const ListLayout l = listLayout(outputs, inputs, getSize());
  const bool one = outputs.size() == 1;
  // one output: the caller's tensor is the shard; several: a packed shard, unpacked after
  const at::Tensor shard = one ? outputs[0] : at::empty({l.total}, outputs[0].options());
  const at::Tensor message = at::empty({l.ok ? l.total * getSize() : 0}, shard.options());
  Call c = callOf(kReduceScatter, "reduce_scatter", c10d::OpType::REDUCE_SCATTER, message, shard,
                  opts.reduceOp, opts.timeout, opts.asyncOp);
  c.shapeOk = l.ok;
  c.alike = l.alike;
  c.inputs = flat(inputs);
  c.outputs = outputs;
  if (l.ok) {
    c.pack = [inputs, l](Call& call) { packLists(call.message, inputs, l); };
    if (!one) c.unpack = [outputs](Call& call) { unpackRows(call.shard, outputs, 1); };
  }
  const bool lower = lowersPremul(shard, opts.reduceOp, group_.config().reduceScatter);
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
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> QncclBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  Call c = callOf(kAllGather, "all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE, output,
                  input, c10d::ReduceOp::SUM, opts.timeout, opts.asyncOp);
  c.inputs = {input};
  c.outputs = {output};
  c.inner = [=](c10d::Backend* b) mutable { return b->_allgather_base(output, input, opts); };
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  group_.refuseOverlap(outputs, "allgather");
  TORCH_CHECK(!inputs.empty(), group_.prefix(), "allgather: no tensors given");
  const ListLayout l = listLayout(inputs, outputs, getSize());
  const bool one = inputs.size() == 1;
  // one input: the caller's tensor is the shard; several: a packed shard
  const at::Tensor shard = one ? inputs[0] : at::empty({l.total}, inputs[0].options());
  const at::Tensor message = at::empty({l.ok ? l.total * getSize() : 0}, shard.options());
  Call c = callOf(kAllGather, "all_gather", c10d::OpType::ALLGATHER, message, shard,
                  c10d::ReduceOp::SUM, opts.timeout, opts.asyncOp);
  c.shapeOk = l.ok;
  c.alike = l.alike;
  c.inputs = inputs;
  c.outputs = flat(outputs);
  if (l.ok) {
    if (!one) c.pack = [inputs](Call& call) { packRows(call.shard, inputs, 1); };
    c.unpack = [outputs, l](Call& call) { unpackLists(call.message, outputs, l); };
  }
  c.inner = [=](c10d::Backend* b) mutable { return b->allgather(outputs, inputs, opts); };
  return issue(std::move(c));
}

// ---- the coalesced forms: several tensors in one call ----
// One tensor: the single form's Call on the caller's tensors. Several, alike (one dtype and
// device, dense; the sharded forms' inputs W times their outputs): one Call on a packed message
// (the tensors' elements side by side; for the sharded forms row c of the message holds every
// tensor's shard c), packed only once the call is to be quantized and unpacked after, so that one
// agreement and one schedule serve the call. Tensors not alike pass through, saying why.

c10::intrusive_ptr<c10d::Work> QncclBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  const char* name = "allreduce_coalesced";
  TORCH_CHECK(!tensors.empty(), group_.prefix(), name, ": no tensors given");
  group_.refuseOverlap(tensors, name);
  const at::Tensor& first = tensors[0];
  TORCH_CHECK_VALUE(first.device().is_cpu() || first.is_cuda(), group_.prefix(), name,
                    ": tensors on ", first.device(),
                    " are not supported; qnccl takes CPU and CUDA tensors");
  const bool alike = alikeAll(tensors);
  const int64_t total = alike ? numelOf(tensors) : 0;
  const at::Tensor message = tensors.size() == 1 ? first : at::empty({total}, first.options());
  Call c = callOf(kAllreduce, name, c10d::OpType::ALLREDUCE_COALESCED, message, at::Tensor(),
                  opts.reduceOp, opts.timeout, opts.asyncOp);
  c.alike = tensors.size() == 1 || alike;
  c.inputs = tensors;
  c.outputs = tensors;
  c.inner = [=](c10d::Backend* b) mutable { return b->allreduce_coalesced(tensors, opts); };
  if (tensors.size() > 1 && alike) {
    c.pack = [tensors](Call& call) { packRows(call.message, tensors, 1); };
    c.unpack = [tensors](Call& call) { unpackRows(call.message, tensors, 1); };
  }
  return issue(std::move(c));
}

Call QncclBackend::shardedCoalesced(int32_t collective, const char* name,
                                    const std::vector<at::Tensor>& outputs,
                                    const std::vector<at::Tensor>& inputs, c10d::ReduceOp op,
                                    std::chrono::milliseconds timeout, bool asyncOp) const {
  group_.refuseOverlap(outputs, name);
  TORCH_CHECK(!inputs.empty() && inputs.size() == outputs.size(), group_.prefix(), name,
              ": needs as many outputs as inputs, at least one (got ", outputs.size(), " and ",
              inputs.size(), ")");
  // the tensors of the message (W rows: the reduce-scatter's inputs, the all-gather's outputs)
  // and of the shard (the reduce-scatter's outputs, the all-gather's inputs)
  const bool rs = collective == kReduceScatter;
  const std::vector<at::Tensor>& full = rs ? inputs : outputs;
  const std::vector<at::Tensor>& part = rs ? outputs : inputs;
  const bool alike = alikeSharded(full, part, getSize());
  const int64_t total = alike ? numelOf(part) : 0;
  const bool one = inputs.size() == 1;
  const at::Tensor message = one ? full[0] : at::empty({total * getSize()}, part[0].options());
  const at::Tensor shard = one ? part[0] : at::empty({total}, part[0].options());
  Call c = callOf(collective, name, c10d::OpType::COALESCED, message, shard, op, timeout, asyncOp);
  c.alike = one || alike;  // one tensor: the single form's checks (factsOf)
  c.inputs = inputs;
  c.outputs = outputs;
  if (one || !alike) return c;
  const int world = getSize();
  if (rs) {
    c.pack = [full, world](Call& call) { packRows(call.message, full, world); };
    c.unpack = [part](Call& call) { unpackRows(call.shard, part, 1); };
  } else {
    c.pack = [part](Call& call) { packRows(call.shard, part, 1); };
    c.unpack = [full, world](Call& call) { unpackRows(call.message, full, world); };
  }
  return c;
}

c10::intrusive_ptr<c10d::Work> QncclBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  Call c = shardedCoalesced(kReduceScatter, "reduce_scatter_tensor_coalesced", outputs, inputs,
                            opts.reduceOp, opts.timeout, opts.asyncOp);
  const bool lower = lowersPremul(outputs[0], opts.reduceOp, group_.config().reduceScatter);
  c.inner = [=](c10d::Backend* b) mutable {
    if (!lower) return b->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
    std::vector<at::Tensor> scaled;
    for (const at::Tensor& x : inputs) scaled.push_back(premultiplied(x, opts.reduceOp));
    c10d::ReduceScatterOptions o = opts;
    o.reduceOp = c10d::ReduceOp::SUM;
    return b->reduce_scatter_tensor_coalesced(outputs, scaled, o);
  };
  return issue(std::move(c));
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  Call c = shardedCoalesced(kAllGather, "allgather_into_tensor_coalesced", outputs, inputs,
                            c10d::ReduceOp::SUM, opts.timeout, opts.asyncOp);
  c.inner = [=](c10d::Backend* b) mutable {
    return b->allgather_into_tensor_coalesced(outputs, inputs, opts);
  };
  return issue(std::move(c));
}

// ---- pass-through ----
// Each: the tensors it writes checked (refuseOverlap), then Group::forward with the tensors it
// reads (pickAll: counted, checked, the device's inner backend).

c10::intrusive_ptr<c10d::Work> QncclBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  return group_.passThrough("broadcast", c10d::OpType::BROADCAST, tensors, tensors, tensors,
                            [=](c10d::Backend* b) mutable { return b->broadcast(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  group_.stats.byCollective[kAllreduce].passthroughCalls++;
  return group_.passThrough(
      "allreduce_sparse", c10d::OpType::_ALLREDUCE_SPARSE, tensors, {}, tensors,
      [=](c10d::Backend* b) mutable { return b->allreduce_sparse(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::reduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::ReduceOptions& opts) {
  return group_.passThrough("reduce", c10d::OpType::REDUCE, tensors, {}, tensors,
                            [=](c10d::Backend* b) mutable { return b->reduce(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  group_.stats.byCollective[kAllGather].passthroughCalls++;
  return group_.passThrough("allgather_coalesced", c10d::OpType::ALLGATHER_COALESCED, inputs,
                            flat(outputs), flat(outputs), [=](c10d::Backend* b) mutable {
                              return b->allgather_coalesced(outputs, inputs, opts);
                            });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::GatherOptions& opts) {
  return group_.passThrough(
      "gather", c10d::OpType::GATHER, inputs, flat(outputs), flat(outputs),
      [=](c10d::Backend* b) mutable { return b->gather(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  return group_.passThrough(
      "scatter", c10d::OpType::SCATTER, outputs, flat(inputs), outputs,
      [=](c10d::Backend* b) mutable { return b->scatter(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& outputSplits,
                                                           std::vector<int64_t>& inputSplits,
                                                           const c10d::AllToAllOptions& opts) {
  return group_.passThrough("all_to_all_single", c10d::OpType::ALLTOALL_BASE, {input}, {output},
                            {output}, [=](c10d::Backend* b) mutable {
                              return b->alltoall_base(output, input, outputSplits, inputSplits,
                                                      opts);
                            });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  return group_.passThrough(
      "all_to_all", c10d::OpType::ALLTOALL, inputs, outputs, outputs,
      [=](c10d::Backend* b) mutable { return b->alltoall(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::send(std::vector<at::Tensor>& tensors, int dstRank,
                                                  int tag) {
  return group_.passThrough(
      "send", c10d::OpType::SEND, tensors, {}, {},
      [=](c10d::Backend* b) mutable { return b->send(tensors, dstRank, tag); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::recv(std::vector<at::Tensor>& tensors, int srcRank,
                                                  int tag) {
  return group_.passThrough(
      "recv", c10d::OpType::RECV, tensors, {}, tensors,
      [=](c10d::Backend* b) mutable { return b->recv(tensors, srcRank, tag); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                           int tag) {
  return group_.passThrough(
      "recv_anysource", c10d::OpType::RECVANYSOURCE, tensors, {}, tensors,
      [=](c10d::Backend* b) mutable { return b->recvAnysource(tensors, tag); });
}

c10::intrusive_ptr<c10d::Work> QncclBackend::barrier(const c10d::BarrierOptions& opts) {
  group_.checkOpen("barrier");
  group_.stats.passthroughCalls++;
  const bool cuda = (opts.device.has_value() && opts.device->is_cuda()) || !opts.device_ids.empty();
  if (cuda && group_.nccl) return group_.nccl->barrier(opts);
  group_.checkUsable("barrier");
  return group_.forward(group_.gloo.get(), "barrier", c10d::OpType::BARRIER, {},
                        [=](c10d::Backend* b) mutable { return b->barrier(opts); });
}

void QncclBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  group_.checkOpen("monitored_barrier");
  group_.checkUsable("monitored_barrier");
  group_.stats.passthroughCalls++;
  group_
      .forward(group_.gloo.get(), "monitored_barrier", c10d::OpType::BARRIER, {},
               [=](c10d::Backend* b) {
                 b->monitoredBarrier(opts, waitAllRanks);
                 return c10::intrusive_ptr<c10d::Work>();
               })
      ->wait();
}

void QncclBackend::setSequenceNumberForGroup() { group_.gloo->setSequenceNumberForGroup(); }

uint64_t QncclBackend::getSequenceNumberForGroup() {
  return group_.gloo->getSequenceNumberForGroup();
}

void QncclBackend::startCoalescing() {
  TORCH_CHECK(group_.nccl, group_.prefix(), "coalescing needs the NCCL backend");
  group_.nccl->startCoalescing();
}

c10::intrusive_ptr<c10d::Work> QncclBackend::endCoalescing() {
  TORCH_CHECK(group_.nccl, group_.prefix(), "coalescing needs the NCCL backend");
  return group_.nccl->endCoalescing();
}

void QncclBackend::shutdown() {
  if (group_.shutDown.exchange(true)) return;  // idempotent: destroy_process_group calls it twice
  // calls still queued run first, within the group's timeout; those that could not start by
  // then fail (each running one is bounded by its own timeout)
  group_.stop(group_.timeout, group_.prefix() +
                                  "the group was destroyed before this collective could start (it "
                                  "was still queued after the group's timeout)");
  if (group_.nccl) group_.nccl->shutdown();
  group_.gloo->shutdown();
}

void QncclBackend::abort() {
  if (group_.shutDown.exchange(true)) return;
  group_.stop(std::chrono::milliseconds(0),
              group_.prefix() + "the group was aborted before this collective could start");
  if (group_.nccl) group_.nccl->abort();
  group_.gloo->abort();
}

}  // namespace qcomm
