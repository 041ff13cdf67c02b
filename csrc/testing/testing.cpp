// qcomm._testing, the test hooks' own extension module, built for the tests only
// (QCOMM_TEST_HOOKS=1, scripts/setup.sh) and linked against qcomm._C, whose code and state it
// shares: codec pieces the tests compare against qcomm/reference.py, the collective schedule over
// the inner backend (what CUDA tensors run) on any device, the CUDA-IPC exchange emulated on host
// memory, a wire-recording backend, and switches the tests flip. Nothing here is a public API;
// what users and the benchmarks may call is in qcomm._C (python/).
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
#include "python/codec.h"
#include "python/convert.h"
#include "python/holder.h"
#include "testing/emulation.h"
#include "testing/ipc_emulation.h"
#include "testing/recording_backend.h"
#include "transport/c10d_transport.h"
#include "transport/ipc_exchange.h"

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

// H float(x) per group of groupSize (CPU; whole groups).
at::Tensor rotateToFloatT(const at::Tensor& x, int groupSize) {
  at::Tensor c = x.contiguous().view({-1});
  at::Tensor out = at::empty({c.numel()}, at::kFloat);
  rotateToFloat(c.data_ptr(), dtypeCode(c.scalar_type()), c.numel(), groupSize,
                out.data_ptr<float>());
  return out;
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

// Rank r's view of the emulated group's buffers (one per rank), as the transport sets it up.
IpcPeers peersOf(const std::vector<uint8_t*>& buffers, int r, int64_t timeoutMs, IpcError* error) {
  IpcPeers peers{};
  const int world = int(buffers.size());
  for (int q = 0; q < world; ++q) peers.buffers[q] = buffers[size_t(q)];
  peers.world = world;
  peers.rank = r;
  peers.timeoutNs = timeoutMs * 1000000;
  peers.hostError = error;
  return peers;
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
        IpcPeers peers = peersOf(bufferPtrs, r, timeoutMs, &error);
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
        IpcPeers peers = peersOf(bufferPtrs, r, timeoutMs, &error);
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

// Every hook, in `m`; backendBase is torch's c10d Backend class.
void registerTesting(py::module& m, py::object backendBase) {
  m.def("rotate_to_float", &rotateToFloatT, py::arg("x"), py::arg("group_size"));
  m.def("noise_salt", &noiseSalt, py::arg("call_seq"), py::arg("rank"), py::arg("phase"));
  // a config to C++ and back, by name (python/convert.h)
  m.def("config_round_trip", [](py::object cfg) { return configToDict(configFrom(cfg)); });
  m.def("cast_from_float", &castFloat, py::arg("x"), py::arg("dtype"));
  m.def("cast_to_float", &castToFloatT, py::arg("x"));
  // the tuner (plan/tuning.h): its decision rule, and per-rank timings skewed on purpose
  m.def("tune_decide", &decideTuning, py::arg("seconds"), py::arg("margin"));
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
  py::class_<RecordingBackend, NoGilPtr<RecordingBackend>>(
      m, "RecordingBackend", backendBase,
      "a c10d backend that forwards to `inner` and records what this rank puts on the wire "
      "(testing/recording_backend.h)")
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

}  // namespace
}  // namespace qcomm

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // qcomm._C first: it registers QncclBackend with pybind11, which the hooks that take a backend
  // cast to (the dynamic loader has already mapped its code, one copy for both modules).
  py::module::import("qcomm._C");
  m.doc() = "qcomm's test hooks (tests only, not a public API)";
  qcomm::registerTesting(m, py::module::import("torch._C._distributed_c10d").attr("Backend"));
}
