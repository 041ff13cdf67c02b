// qcomm._C._testing (testing.h): the codec entry points the tests compare against
// qcomm/reference.py, the collective schedule over the inner backend (what CUDA tensors run) on any
// device, the CUDA-IPC exchange emulated on host memory, a wire-recording backend, and switches the
// tests and benchmarks flip. Nothing here is part of the public API.
#include "python/testing.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <algorithm>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "algo/algorithms.h"
#include "backend/backend.h"
#include "backend/progress.h"
#include "backend/staging.h"
#include "codec/codec_cpu.h"
#include "codec/codec_ops.h"
#include "common/errors.h"
#include "common/settings.h"
#include "common/torch_dtype.h"
#include "cuda/ipc_layout.h"
#include "python/convert.h"
#include "python/emulation.h"
#include "python/holder.h"
#include "python/ipc_emulation.h"
#include "python/recording_backend.h"
#include "transport/c10d_transport.h"
#include "transport/ipc_exchange.h"
#ifdef QCOMM_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "cuda/cuda_codec_ops.h"
#endif

namespace py = pybind11;

namespace qcomm {

// The one friend of QncclBackend (backend.h): the state the test hooks set, from outside the
// class, so that the product class has no methods for tests.
struct BackendTestAccess {
  static void setTuneTimingFactors(QncclBackend& b, std::vector<double> factors) {
    std::lock_guard<std::mutex> lock(b.tuner_.mutex_);
    b.tuner_.timingFactors_ = std::move(factors);
  }
  static void setCallTimingFactor(QncclBackend& b, double factor) {
    std::lock_guard<std::mutex> lock(b.tuner_.mutex_);
    b.tuner_.callTimingFactor_ = factor;
  }
  // Holds the lock of the group's buffers for `seconds` on another thread (as a running call
  // does); returns once it is held.
  static void holdScratchLock(QncclBackend& b, double seconds) {
    auto held = std::make_shared<std::promise<void>>();
    std::future<void> ready = held->get_future();
    QncclBackend* be = &b;
    std::thread([be, held, seconds] {
      std::lock_guard<std::mutex> lock(be->group().scratchMutex);
      held->set_value();
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    }).detach();
    ready.wait();
  }
  // The host agreement a quantized CUDA call makes (call_cuda.cpp runCuda), from this thread.
  static void agreeOnCudaCall(QncclBackend& b, const Plan& plan,
                              std::chrono::milliseconds timeout) {
    Group& g = b.group();
    g.requireAgreement(g.agreeOnQueue(plan, timeout), "allreduce", kAllreduce);
  }
};

#ifdef QCOMM_WITH_CUDA
void registerCudaTesting(py::module& m);  // cuda_testing.cpp
#endif
#ifdef QCOMM_EXPERIMENTS
void registerFusedTesting(py::module& m);  // testing_fused.cpp
#endif

namespace {

CodecSpec makeSpec(int bits, int groupSize, bool symmetric, at::ScalarType raw) {
  QuantConfig probe;
  probe.rsBits = bits;
  probe.groupSize = groupSize;
  validateConfig(probe);
  return CodecSpec{bits, groupSize, symmetric ? 1 : 0, dtypeCode(raw)};
}

// No noise (round to nearest) when salt is None.
Noise noiseOf(const py::object& salt, int64_t base) {
  return Noise{salt.is_none() ? 0u : salt.cast<uint32_t>(), base, salt.is_none() ? 0 : 1};
}

// The CodecOps of memory on `device`: the CPU loops, or the CUDA kernels on the device's current
// stream.
std::unique_ptr<CodecOps> codecOpsFor(const c10::Device& device) {
  if (device.is_cpu()) return std::make_unique<CpuCodecOps>();
#ifdef QCOMM_WITH_CUDA
  if (device.is_cuda()) {
    return makeCudaCodecOps(c10::cuda::getCurrentCUDAStream(device.index()).stream());
  }
#endif
  TORCH_CHECK_VALUE(false, "[qcomm] no codec for tensors on ", device,
                    device.is_cuda() ? " (this build of qcomm has no CUDA kernels)" : "");
}

// Encode a 1-D CPU tensor with one codec: returns the wire bytes. rotate: the rotated codec
// (encodeRotatedBlock, whole groups; a raw codec, bits 0, then stores fp32).
// `out`, where given, receives the result instead of a new tensor (benchmarks reuse one buffer, so
// that a large output's first-touch page faults are not timed with the codec).
at::Tensor outputOf(const c10::optional<at::Tensor>& out, int64_t n, at::ScalarType dtype) {
  if (!out) return at::empty({n}, dtype);
  TORCH_CHECK_VALUE(out->device().is_cpu() && out->scalar_type() == dtype && out->dim() == 1 &&
                        out->numel() == n && out->is_contiguous(),
                    "[qcomm] out: expected a contiguous 1-D CPU tensor of ", n, " ", dtype);
  return *out;
}

at::Tensor codecEncode(const at::Tensor& x, int bits, int groupSize, bool symmetric,
                       py::object noiseSalt, int64_t noiseBase, bool rotate,
                       const c10::optional<at::Tensor>& into) {
  TORCH_CHECK_VALUE(x.device().is_cpu(), "[qcomm] codec: CPU tensors only");
  at::Tensor c = x.contiguous().view({-1});
  const CodecSpec spec =
      makeSpec(bits, groupSize, symmetric, rotate ? at::kFloat : c.scalar_type());
  // every byte is written
  at::Tensor out = outputOf(into, encodedBytes(c.numel(), spec), at::kByte);
  const Noise noise = noiseOf(noiseSalt, noiseBase);
  if (rotate) {
    encodeRotatedBlock(c.data_ptr(), dtypeCode(c.scalar_type()), c.numel(), spec,
                       out.data_ptr<uint8_t>(), noise);
  } else {
    encodeBlock(c.data_ptr(), dtypeCode(c.scalar_type()), c.numel(), spec, out.data_ptr<uint8_t>(),
                noise);
  }
  return out;
}

// Decode wire bytes of n elements to fp32 (rotate: and rotate each group back).
// accumulate: out += the decoded values (out must be given).
at::Tensor codecDecode(const at::Tensor& bytes, int64_t n, int bits, int groupSize, bool symmetric,
                       at::ScalarType raw, bool rotate, const c10::optional<at::Tensor>& into,
                       bool accumulate, bool streamed) {
  const CodecSpec spec = makeSpec(bits, groupSize, symmetric, raw);
  TORCH_CHECK_VALUE(bytes.scalar_type() == at::kByte && bytes.numel() == encodedBytes(n, spec),
                    "[qcomm] codec: expected ", encodedBytes(n, spec), " bytes");
  TORCH_CHECK_VALUE(!accumulate || (into && !rotate),
                    "[qcomm] codec: accumulate=True adds into out= (not rotated)");
  TORCH_CHECK_VALUE(!streamed || (!accumulate && !rotate),
                    "[qcomm] codec: streamed=True overwrites (not accumulate, not rotated)");
  at::Tensor b = bytes.contiguous();
  at::Tensor out = outputOf(into, n, at::kFloat);
  if (rotate) {
    decodeRotatedBlock(b.data_ptr<uint8_t>(), n, spec, out.data_ptr<float>());
  } else if (streamed) {
    decodeBlockStreamed(b.data_ptr<uint8_t>(), n, spec, out.data_ptr<float>());
  } else {
    decodeBlock(b.data_ptr<uint8_t>(), n, spec, out.data_ptr<float>(), accumulate);
  }
  return out;
}

// The sum, in fp32 in list order, of the decoded values of blocks (CPU; CpuCodecOps::decodeSum),
// added to out= with accumulate.
at::Tensor codecDecodeSum(const std::vector<at::Tensor>& blocks, int64_t n, int bits, int groupSize,
                          bool symmetric, at::ScalarType raw, const c10::optional<at::Tensor>& into,
                          bool accumulate) {
  const CodecSpec spec = makeSpec(bits, groupSize, symmetric, raw);
  TORCH_CHECK_VALUE(!blocks.empty(), "[qcomm] codec_decode_sum: no block to sum");
  TORCH_CHECK_VALUE(!accumulate || into,
                    "[qcomm] codec_decode_sum: accumulate=True adds into out=");
  std::vector<at::Tensor> held;
  for (const at::Tensor& b : blocks) {
    TORCH_CHECK_VALUE(
        b.device().is_cpu() && b.scalar_type() == at::kByte && b.numel() == encodedBytes(n, spec),
        "[qcomm] codec_decode_sum: expected ", encodedBytes(n, spec),
        " bytes (uint8, CPU) per block");
    held.push_back(b.contiguous());
  }
  at::Tensor out = outputOf(into, n, at::kFloat);
  CpuCodecOps ops;
  ops.decodeSum([&](int j) { return held[size_t(j)].data_ptr<uint8_t>(); }, int(held.size()), n,
                spec, out.data_ptr<float>(), accumulate);
  return out;
}

// H float(x) per group of groupSize (CPU; whole groups).
at::Tensor rotateToFloatT(const at::Tensor& x, int groupSize) {
  at::Tensor c = x.contiguous().view({-1});
  at::Tensor out = at::empty({c.numel()}, at::kFloat);
  rotateToFloat(c.data_ptr(), dtypeCode(c.scalar_type()), c.numel(), groupSize,
                out.data_ptr<float>());
  return out;
}

// One ring hop through the CodecOps of local's device (CPU loops or CUDA kernels on the current
// stream): partial = decode(src) + local, dst = encode(partial). Both codecs carry local's dtype
// as their raw dtype, as a plan's do. Returns (partial, dst).
std::tuple<at::Tensor, at::Tensor> codecOpsHop(const at::Tensor& src, int inBits,
                                               const at::Tensor& local, int outBits, int groupSize,
                                               bool symmetric, py::object noiseSalt,
                                               int64_t noiseBase,
                                               const c10::optional<at::Tensor>& intoPartial,
                                               const c10::optional<at::Tensor>& intoDst) {
  const c10::DeviceGuard guard(local.device());
  at::Tensor l = local.contiguous().view({-1});
  const int64_t n = l.numel();
  const CodecSpec in = makeSpec(inBits, groupSize, symmetric, l.scalar_type());
  const CodecSpec out = makeSpec(outBits, groupSize, symmetric, l.scalar_type());
  TORCH_CHECK_VALUE(src.device() == l.device() && src.scalar_type() == at::kByte &&
                        src.numel() == encodedBytes(n, in),
                    "[qcomm] hop: expected ", encodedBytes(n, in), " bytes on ", l.device());
  at::Tensor s = src.contiguous();
  at::Tensor partial = intoPartial && l.device().is_cpu()
                           ? outputOf(intoPartial, n, at::kFloat)
                           : at::empty({n}, l.options().dtype(at::kFloat));
  at::Tensor dst = intoDst && l.device().is_cpu()
                       ? outputOf(intoDst, encodedBytes(n, out), at::kByte)
                       : at::empty({encodedBytes(n, out)}, l.options().dtype(at::kByte));
  codecOpsFor(l.device())
      ->decodeAddEncode(s.data_ptr<uint8_t>(), in, l.data_ptr(), in.rawDtype, n,
                        partial.data_ptr<float>(), out, dst.data_ptr<uint8_t>(),
                        noiseOf(noiseSalt, noiseBase));
  return {partial, dst};
}

// fp32 -> dtype and back through the shared header's converters (compared with torch's casts).
at::Tensor castFloat(const at::Tensor& x, at::ScalarType to) {
  at::Tensor c = x.contiguous().to(at::kFloat);
  at::Tensor out = at::empty(c.sizes(), to);
  castFromFloat(c.data_ptr<float>(), c.numel(), dtypeCode(to), out.data_ptr());
  return out;
}

at::Tensor castToFloatT(const at::Tensor& x) {
  at::Tensor c = x.contiguous();
  at::Tensor out = at::empty(c.sizes(), at::kFloat);
  castToFloat(c.data_ptr(), dtypeCode(c.scalar_type()), c.numel(), out.data_ptr<float>());
  return out;
}

// An allreduce of `t` (SUM, or AVG) with the schedule CUDA tensors take: one collective per
// exchange over be.inner(t.is_cuda()), chunks whole, the CodecOps of t's device (CUDA: the
// current stream); planned as QncclBackend::allreduce plans it; the result lands in t, which is
// returned. callSeq < 0 takes the backend's next sequence number without advancing it, so a
// following dist.all_reduce rounds with the same noise. forceWorld1 plans a world-size-1 group as
// if it were quantized (one chunk), the only case a single GPU can run over NCCL.
at::Tensor collectiveAllreduce(QncclBackend& be, at::Tensor t, bool avg, bool forceWorld1,
                               int64_t callSeq, std::chrono::milliseconds timeout) {
  const std::string where =
      rankPrefix(be.getRank(), be.getSize()) + "collective_allreduce_for_test: ";
  Plan plan;
  if (forceWorld1) {
    TORCH_CHECK_VALUE(be.getSize() == 1, where, "force_world1 needs a group of one rank, not ",
                      be.getSize());
    CallFacts f;
    f.numel = t.numel();
    f.dtype = dtypeOf(t.scalar_type());
    f.opSum = !avg;
    f.opAvg = avg;
    f.world = 1;
    TORCH_CHECK_VALUE(f.dtype >= 0 && f.numel > 0 && t.layout() == at::kStrided, where,
                      "needs a non-empty dense fp32, fp16 or bf16 tensor");
    plan = quantizedPlan(f, be.getConfig());
  } else {
    plan = be.plan(kAllreduce, t, at::Tensor(),
                   c10d::ReduceOp(avg ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM));
  }
  TORCH_CHECK_VALUE(plan.quantize, where, "this allreduce would pass through (", plan.reason, ")");
  plan.callSeq = callSeq >= 0 ? uint32_t(callSeq) : be.group().callSeq.load();
  c10::intrusive_ptr<c10d::Backend> inner = be.inner(t.is_cuda());
  TORCH_CHECK_VALUE(inner, where, "the group has no inner backend for ", t.device());
  const c10::DeviceGuard guard(t.device());
  // staged as the backend stages a message (backend/staging.h; on the current stream, for a CUDA
  // tensor)
  Staged msg(plan, t);
  std::unique_ptr<CodecOps> ops = codecOpsFor(t.device());
  C10dTransport transport(inner.get(), be.getRank(), plan.world, timeout,
                          C10dTransport::kCollectives, t.is_cuda());
  runAllreduce(plan, transport, *ops, msg.data());
  msg.finish();
  return t;
}

// CPU memory that this thread allocated through c10's CPU allocator (at::empty) while
// ipc_separate_emulate counts: a call must allocate nothing once its first exchange has begun
// (with CUDA IPC and ranks as threads, an allocation that synchronises the device could wait for
// a peer's barrier kernel, which waits for this rank; the schedules allocate first).
thread_local int64_t tlCpuAllocations = 0;

class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) override {
    ++tlCpuAllocations;
    return base_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    base_->copy_data(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

// Counts through CountingCpuAllocator while it lives (the highest priority, so that it is the
// allocator at::empty takes; the one before it restored at that priority).
class CountCpuAllocations {
 public:
  CountCpuAllocations() : before_(c10::GetCPUAllocator()), counting_(before_) {
    c10::SetCPUAllocator(&counting_, kPriority);
  }
  ~CountCpuAllocations() { c10::SetCPUAllocator(before_, kPriority); }
  CountCpuAllocations(const CountCpuAllocations&) = delete;
  CountCpuAllocations& operator=(const CountCpuAllocations&) = delete;

 private:
  static constexpr uint8_t kPriority = 255;
  c10::Allocator* before_;
  CountingCpuAllocator counting_;
};

// The host executor of the exchange, which also notes this thread's allocation count when its
// first barrier (the start of the call's first exchange) runs.
struct CountingHostCopies : HostCopies {
  int64_t atFirstBarrier = -1;
  bool barrier(uint32_t index, const uint32_t* fingerprint = nullptr) {
    if (atFirstBarrier < 0) atFirstBarrier = tlCpuAllocations;
    return HostCopies::barrier(index, fingerprint);
  }
};

// An allreduce (two_step, ring or semi_ring) over CUDA IPC with the separate kernels
// (QCOMM_IPC_KERNELS=separate) run on host memory: the algorithm's schedule with the CPU codec, its
// exchanges copied through `buffers` (one zeroed byte tensor per rank, kept across calls so the
// barrier counts carry on) by the schedule of ipc_exchange.h, one thread per rank of `ranks`
// (default all), in place on `inputs`. As the backend's: the call's first barrier compares the
// ranks' plan fingerprints, and a rank whose barriers gave up leaves 0xFF bytes (NaN) in its
// output. Tests of mismatched calls give ranks inputs of different numels or dtypes, their own
// configs (`rank_configs`) or call numbers (`rank_seqs`). The ranks of `abandon` (among `ranks`)
// fail before their call's launches instead of running it, once the others wait for them in its
// first barrier, and take the backend's abort path (IpcTransport::abandon): their outputs stay
// as they were.
std::vector<at::Tensor> ipcSeparateEmulate(std::vector<at::Tensor> inputs,
                                           std::vector<at::Tensor> buffers, py::object cfg,
                                           bool average, uint32_t callSeq, int64_t timeoutMs,
                                           std::vector<int> ranks, std::vector<uint32_t> rankSeqs,
                                           std::vector<py::object> rankConfigs,
                                           std::vector<int> abandon) {
  const int world = int(inputs.size());
  TORCH_CHECK_VALUE(rankSeqs.empty() || int(rankSeqs.size()) == world,
                    "ipc_separate_emulate: rank_seqs needs one call number per rank");
  TORCH_CHECK_VALUE(rankConfigs.empty() || int(rankConfigs.size()) == world,
                    "ipc_separate_emulate: rank_configs needs one config per rank");
  // each rank's plan, from its own input, config and call number
  std::vector<Plan> plans;
  for (int r = 0; r < world; ++r) {
    const std::vector<at::Tensor> mine(size_t(world), inputs[size_t(r)]);
    plans.push_back(emulatedPlan("ipc_separate_emulate", mine, buffers,
                                 rankConfigs.empty() ? cfg : rankConfigs[size_t(r)], average,
                                 rankSeqs.empty() ? callSeq : rankSeqs[size_t(r)], true));
  }
  std::string why;
  const IpcExchangeGeometry g = ipcExchangeGeometry(world, buffers[0].numel(), &why);
  TORCH_CHECK_VALUE(why.empty(), "ipc_separate_emulate: ", why);
  if (ranks.empty()) {
    for (int r = 0; r < world; ++r) ranks.push_back(r);
  }
  auto abandons = [&abandon](int r) {
    return std::find(abandon.begin(), abandon.end(), r) != abandon.end();
  };
  std::vector<int> running;  // the ranks that run their call
  for (int r : ranks) {
    if (!abandons(r)) running.push_back(r);
  }
  for (int r : abandon) {
    TORCH_CHECK_VALUE(std::find(ranks.begin(), ranks.end(), r) != ranks.end(),
                      "ipc_separate_emulate: abandon names rank ", r, ", which is not in ranks");
  }
  IpcError error{};
  std::vector<uint8_t*> bufferPtrs;
  for (auto& b : buffers) bufferPtrs.push_back(b.data_ptr<uint8_t>());
  std::vector<std::string> failed(ranks.size());
  // staged as the backend stages a message (backend/staging.h: a rotated message that ends inside
  // a group runs on a copy padded with zeros to whole groups), before the calls begin; the
  // results are copied back after
  std::vector<Staged> staged(static_cast<size_t>(world));
  std::vector<at::Tensor> data = inputs;
  for (int r : ranks) {
    staged[size_t(r)] = Staged(plans[size_t(r)], inputs[size_t(r)]);
    data[size_t(r)] = staged[size_t(r)].data();
  }
  {
    py::gil_scoped_release noGil;
    const CountCpuAllocations counting;
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ranks.size(); ++i) {
      threads.emplace_back([&, i]() {
        const int r = ranks[i];
        IpcPeers peers{};
        for (int q = 0; q < world; ++q) peers.buffers[q] = bufferPtrs[size_t(q)];
        peers.world = world;
        peers.rank = r;
        peers.timeoutNs = timeoutMs * 1000000;
        peers.hostError = &error;
        if (abandons(r)) {
          // its call fails before its launches (as an allocation failing): the abort path, once
          // its peers wait for it; nothing of the call ran, so no end check either
          failed[i] = rankPrefix(r, world) +
                      (ipcAbandonEmulate(peers, running)
                           ? ipcAbandonedError("emulated: an allocation failed")
                           : "ipc_separate_emulate: a peer never entered the call's first barrier");
          return;
        }
        try {
          const Plan& plan = plans[size_t(r)];
          CountingHostCopies copies;
          copies.peers = peers;
          IpcExchangeTransport<CountingHostCopies> t(copies, g, bufferPtrs.data(), r, world,
                                                     planFingerprint(plan));
          CpuCodecOps ops;
          const int64_t before = tlCpuAllocations;
          runAllreduce(plan, t, ops, data[size_t(r)]);
          const int64_t first = t.executor().atFirstBarrier;
          const int64_t late = first < 0 ? 0 : tlCpuAllocations - first;
          TORCH_CHECK(first >= before, "no exchange began");
          TORCH_CHECK(late == 0, rankPrefix(r, world), "ipc_separate_emulate: the call allocated ",
                      late, " time(s) after its first exchange began");
        } catch (const std::exception& e) {
          failed[i] = e.what();
        }
        // the kernels run to the end of the call whatever gave up; here the host stopped at the
        // barrier that did, and the end check runs as it would after them
        at::Tensor& out = data[size_t(r)];
        ipcPoisonIfAbortedEmulate(peers, static_cast<uint8_t*>(out.data_ptr()), out.nbytes());
      });
    }
    for (auto& t : threads) t.join();
  }
  for (int r : ranks) staged[size_t(r)].finish();
  int gaveUp = 0;
  for (const std::string& f : failed) gaveUp += f.empty() ? 0 : 1;
  TORCH_CHECK(error.code == 0, rankPrefix(int(error.rank), world), describeIpcError(error), " (",
              gaveUp, " of ", ranks.size(), " ranks stopped)");
  for (const std::string& f : failed) TORCH_CHECK(f.empty(), f);
  return inputs;
}

// A reduce-scatter (collective 1) or all-gather (2) over CUDA IPC with the separate kernels run
// on host memory, as ipc_separate_emulate runs an allreduce: the schedule's reduce half or its
// gather phase with the CPU codec, the exchanges copied through `buffers` by ipc_exchange.h's
// schedule, one thread per rank. inputs: a reduce-scatter's W messages (op "sum", "avg" or
// "premul" with `factor`), an all-gather's W shards. Returns each rank's output: its shard, or
// the gathered message.
std::vector<at::Tensor> ipcShardedEmulate(std::vector<at::Tensor> inputs,
                                          std::vector<at::Tensor> buffers, py::object cfg,
                                          int32_t collective, const std::string& op, double factor,
                                          uint32_t callSeq, int64_t timeoutMs) {
  const char* what = "ipc_sharded_emulate";
  const int world = int(inputs.size());
  TORCH_CHECK_VALUE(collective == kReduceScatter || collective == kAllGather, what,
                    ": collective 1 (reduce-scatter) or 2 (all-gather), not ", collective);
  TORCH_CHECK_VALUE(op == "sum" || op == "avg" || op == "premul", what,
                    ": op sum, avg or premul, not ", op);
  // the plan, from facts as the backend makes them (call.cpp factsOf)
  const std::vector<at::Tensor> messages(
      size_t(world), collective == kAllGather
                         ? at::empty({inputs[0].numel() * world}, inputs[0].options())
                         : inputs[0]);
  Plan plan = emulatedPlan(what, messages, buffers, cfg, false, callSeq, true, collective,
                           collective == kReduceScatter ? op : "sum", factor);
  std::vector<at::Tensor> outs;
  for (int r = 0; r < world; ++r) {
    TORCH_CHECK_VALUE(inputs[size_t(r)].is_contiguous() &&
                          inputs[size_t(r)].sizes() == inputs[0].sizes() &&
                          inputs[size_t(r)].scalar_type() == inputs[0].scalar_type(),
                      what, ": contiguous inputs of one shape and dtype");
    outs.push_back(collective == kAllGather ? messages[0].clone()
                                            : at::empty({plan.chunkElems}, inputs[0].options()));
  }
  std::string why;
  const IpcExchangeGeometry g = ipcExchangeGeometry(world, buffers[0].numel(), &why);
  TORCH_CHECK_VALUE(why.empty(), what, ": ", why);
  IpcError error{};
  std::vector<uint8_t*> bufferPtrs;
  for (auto& b : buffers) bufferPtrs.push_back(b.data_ptr<uint8_t>());
  std::vector<std::string> failed(static_cast<size_t>(world));
  {
    py::gil_scoped_release noGil;
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r]() {
        IpcPeers peers{};
        for (int q = 0; q < world; ++q) peers.buffers[q] = bufferPtrs[size_t(q)];
        peers.world = world;
        peers.rank = r;
        peers.timeoutNs = timeoutMs * 1000000;
        peers.hostError = &error;
        at::Tensor& out = outs[size_t(r)];
        try {
          HostCopies copies;
          copies.peers = peers;
          IpcExchangeTransport<HostCopies> t(copies, g, bufferPtrs.data(), r, world,
                                             planFingerprint(plan));
          CpuCodecOps ops;
          if (collective == kReduceScatter) {
            runReduceScatter(plan, t, ops, inputs[size_t(r)], out);
          } else {
            out.narrow(0, int64_t(r) * plan.chunkElems, plan.chunkElems)
                .copy_(inputs[size_t(r)].reshape({-1}));
            runAllGather(plan, t, ops, out);
          }
        } catch (const std::exception& e) {
          failed[size_t(r)] = e.what();
        }
        ipcPoisonIfAbortedEmulate(peers, static_cast<uint8_t*>(out.data_ptr()), out.nbytes());
      });
    }
    for (auto& t : threads) t.join();
  }
  TORCH_CHECK(error.code == 0, rankPrefix(int(error.rank), world), describeIpcError(error));
  for (const std::string& f : failed) TORCH_CHECK(f.empty(), f);
  return outs;
}

}  // namespace

void registerTesting(py::module& m, py::object backendBase) {
  m.def("codec_encode", &codecEncode, py::arg("x"), py::arg("bits"), py::arg("group_size"),
        py::arg("symmetric"), py::arg("noise_salt") = py::none(), py::arg("noise_base") = 0,
        py::arg("rotate") = false, py::arg("out") = py::none());
  m.def("codec_decode", &codecDecode, py::arg("bytes"), py::arg("numel"), py::arg("bits"),
        py::arg("group_size"), py::arg("symmetric"), py::arg("raw_dtype") = at::kFloat,
        py::arg("rotate") = false, py::arg("out") = py::none(), py::arg("accumulate") = false,
        py::arg("streamed") = false);
  m.def("rotate_to_float", &rotateToFloatT, py::arg("x"), py::arg("group_size"));
  m.def("encoded_bytes", [](int64_t n, int bits, int groupSize, bool symmetric) {
    return encodedBytes(n, CodecSpec{bits, groupSize, symmetric ? 1 : 0, kFloat32});
  });
  m.def("codec_decode_sum", &codecDecodeSum, py::arg("blocks"), py::arg("numel"), py::arg("bits"),
        py::arg("group_size"), py::arg("symmetric"), py::arg("raw_dtype") = at::kFloat,
        py::arg("out") = py::none(), py::arg("accumulate") = false);
  m.def("codec_ops_hop", &codecOpsHop, py::arg("src"), py::arg("in_bits"), py::arg("local"),
        py::arg("out_bits"), py::arg("group_size"), py::arg("symmetric"),
        py::arg("noise_salt") = py::none(), py::arg("noise_base") = 0,
        py::arg("partial_out") = py::none(), py::arg("out") = py::none());
  m.def("noise_salt", &noiseSalt, py::arg("call_seq"), py::arg("rank"), py::arg("phase"));
  // a config to C++ and back, by name (python/convert.h)
  m.def("config_round_trip", [](py::object cfg) { return configToDict(configFrom(cfg)); });
  m.def("cast_from_float", &castFloat, py::arg("x"), py::arg("dtype"));
  m.def("cast_to_float", &castToFloatT, py::arg("x"));
  // the CPU codec loops' instruction set, switched (tests and benchmarks compare them; users set
  // QCOMM_CPU_ISA)
  m.def("set_cpu_isa", &setCpuIsa, py::arg("name"));
  // the tuner (plan/tuning.h): its decision rule, and per-rank timings skewed on purpose
  m.def(
      "tune_candidates",
      [](int world, bool streamOrdered, int32_t collective) {
        std::vector<std::string> out;
        for (const TuneChoice& c : tuneCandidates(world, streamOrdered, collective)) {
          out.push_back(choiceName(c));
        }
        return out;
      },
      py::arg("world"), py::arg("stream_ordered") = false, py::arg("collective") = 0);
  m.def("tune_decide", &decideTuning, py::arg("seconds"), py::arg("margin"));
  // the call fingerprint the CUDA-IPC barrier compares (plan.h planFingerprint), of the plan a
  // call of `numel` elements of `dtype` would have on `world` ranks
  m.def(
      "plan_fingerprint",
      [](py::object cfg, int64_t numel, at::ScalarType dtype, bool average, uint32_t callSeq,
         int world) {
        CallFacts f;
        f.numel = numel;
        f.dtype = dtypeCode(dtype);
        f.opSum = !average;
        f.opAvg = average;
        f.world = world;
        Plan plan = makePlan(f, configFrom(cfg));
        plan.callSeq = callSeq;
        return planFingerprint(plan);
      },
      py::arg("config"), py::arg("numel"), py::arg("dtype"), py::arg("average") = false,
      py::arg("call_seq") = 0, py::arg("world") = 2);
  m.def("tune_keep_after_first_run", &keepAfterFirstRun, py::arg("seconds"), py::arg("factor"));
  m.def("tune_keep", &tuneKeep, py::arg("first"), py::arg("factor"), py::arg("budget"),
        py::arg("min_rounds"));
  m.def("tune_rounds", &tuneRounds, py::arg("first"), py::arg("keep"), py::arg("budget"),
        py::arg("min_rounds"), py::arg("max_rounds"));
  m.def("tune_round_order", &tuneRoundOrder, py::arg("n"), py::arg("round"));
  m.def(
      "set_tune_timing_factors",
      [](py::object backend, std::vector<double> factors) {
        BackendTestAccess::setTuneTimingFactors(*backend.cast<QncclBackend*>(), std::move(factors));
      },
      py::arg("backend"), py::arg("factors"));
  m.def(
      "header_mismatch",
      [](uint32_t seq0, uint32_t seq1) {
        CallFacts f;
        f.numel = 1 << 20;
        f.dtype = kFloat32;
        f.opSum = true;
        f.world = 2;
        Plan a = quantizedPlan(f, QuantConfig{}), b = a;
        a.callSeq = seq0;
        b.callSeq = seq1;
        return describeMismatch({headerOf(a), headerOf(b)});
      },
      py::arg("seq0"), py::arg("seq1"),
      "what the header exchange says of two ranks whose equal plans carry these call numbers");
  m.def(
      "plan_header_bytes", []() { return int64_t(sizeof(PlanHeader)); },
      "bytes of the plan header each rank contributes to the header exchange");
  m.def(
      "set_call_timing_factor",
      [](py::object backend, double factor) {
        BackendTestAccess::setCallTimingFactor(*backend.cast<QncclBackend*>(), factor);
      },
      py::arg("backend"), py::arg("factor"),
      "this rank's real-call durations the drift check sees are multiplied by factor");
  m.def(
      "hold_buffer_lock",
      [](py::object backend, double seconds) {
        BackendTestAccess::holdScratchLock(*backend.cast<QncclBackend*>(), seconds);
      },
      py::arg("backend"), py::arg("seconds"), py::call_guard<py::gil_scoped_release>(),
      "holds the lock a running quantized call holds, for `seconds`, on another thread");
  m.def(
      "agree_as_cuda_calls_do",
      [](py::object backend, const at::Tensor& t, bool avg, std::chrono::milliseconds timeout) {
        QncclBackend* be = backend.cast<QncclBackend*>();
        Plan plan = be->plan(kAllreduce, t, at::Tensor(),
                             c10d::ReduceOp(avg ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM));
        TORCH_CHECK_VALUE(plan.quantize, "agree_as_cuda_calls_do: this allreduce would pass ",
                          "through (", plan.reason, ")");
        plan.callSeq = be->group().callSeq.load();
        const py::gil_scoped_release noGil;
        BackendTestAccess::agreeOnCudaCall(*be, plan, timeout);
      },
      py::arg("backend"), py::arg("tensor"), py::arg("avg") = false,
      py::arg("timeout") = std::chrono::milliseconds(60000),
      "the host agreement a quantized CUDA allreduce of this tensor's numel and dtype makes "
      "(call_cuda.cpp runCuda), issued from the calling thread as the CUDA path issues "
      "it, with the call number the next quantized call takes (not advanced); raises a mismatch");
  m.def("plans_made", &plansMade, "makePlan's calls in this process so far (plan.h plansMade)");
  m.def("live_backends", &QncclBackend::liveCount,
        "QncclBackend objects alive in this process (for tests of group destruction)");
  m.def("progress_threads", &ProgressQueue::liveThreads,
        "groups' progress threads alive in this process (for tests of group destruction)");
  m.def("reload_settings", &settings::reload,
        "forget the process-scoped settings read so far (tests that change the environment)");
  m.def("collective_allreduce_for_test", &collectiveAllreduce, py::arg("backend"),
        py::arg("tensor"), py::arg("avg") = false, py::arg("force_world1") = false,
        py::arg("call_seq") = -1, py::arg("timeout") = std::chrono::milliseconds(300000),
        py::call_guard<py::gil_scoped_release>());
  m.def("ipc_separate_emulate", &ipcSeparateEmulate, py::arg("inputs"), py::arg("buffers"),
        py::arg("config"), py::arg("average") = false, py::arg("call_seq") = 0,
        py::arg("timeout_ms") = 60000, py::arg("ranks") = std::vector<int>{},
        py::arg("rank_seqs") = std::vector<uint32_t>{},
        py::arg("rank_configs") = std::vector<py::object>{},
        py::arg("abandon") = std::vector<int>{});
  m.def("ipc_sharded_emulate", &ipcShardedEmulate, py::arg("inputs"), py::arg("buffers"),
        py::arg("config"), py::arg("collective"), py::arg("op") = "sum", py::arg("factor") = 1.0,
        py::arg("call_seq") = 0, py::arg("timeout_ms") = 60000);
  m.def(
      "ipc_exchange_geometry",
      [](int world, int64_t bufferBytes) {
        std::string why;
        const IpcExchangeGeometry g = ipcExchangeGeometry(world, bufferBytes, &why);
        py::dict d;
        d["half_bytes"] = g.halfBytes;
        d["round_bytes"] = g.roundBytes;
        d["data_offset"] = kIpcDataOffset;
        d["error"] = why;
        return d;
      },
      py::arg("world"), py::arg("buffer_bytes"));
  py::class_<RecordingBackend, NoGilPtr<RecordingBackend>>(m, "RecordingBackend", backendBase)
      .def(py::init([](py::object inner) {
             return c10::make_intrusive<RecordingBackend>(backendOf(inner));
           }),
           py::arg("inner"))
      .def("log", &RecordingBackend::log)
      .def("clear", &RecordingBackend::clear);
#ifdef QCOMM_WITH_CUDA
  registerCudaTesting(m);
#endif
#ifdef QCOMM_EXPERIMENTS
  registerFusedTesting(m);
#endif
}

}  // namespace qcomm
