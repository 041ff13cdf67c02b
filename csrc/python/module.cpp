// Python bindings of qcomm._C: the backend class, its configuration and statistics, and the codec
// entry points the tests compare against qcomm/reference.py.
#include <c10/core/CPUAllocator.h>
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <thread>

#include "algo/algorithms.h"
#include "algo/collective.h"
#include "backend/backend.h"
#include "codec/codec_cpu.h"
#include "codec/codec_ops.h"
#include "cuda/ipc_layout.h"
#include "python/ipc_emulation.h"
#include "python/recording_backend.h"
#include "transport/ipc_exchange.h"

namespace py = pybind11;

namespace qcomm {
namespace {

// torch binds c10d::Backend with a holder that drops the GIL in its destructor (the inner
// ProcessGroupNCCL joins threads when it dies). Ours must have the same single-pointer layout so
// that pybind can hand our object to torch as a Backend.
template <class T>
class NoGilPtr {
 public:
  NoGilPtr() = default;
  explicit NoGilPtr(T* p) : p_(c10::intrusive_ptr<T>::reclaim_copy(p)) {}
  NoGilPtr(c10::intrusive_ptr<T> p) : p_(std::move(p)) {}  // NOLINT(runtime/explicit)
  ~NoGilPtr() {
    if (p_ && PyGILState_Check()) {
      py::gil_scoped_release release;
      p_.reset();
    }
  }
  T* get() const { return p_.get(); }

 private:
  c10::intrusive_ptr<T> p_;
};

int32_t dtypeCode(at::ScalarType t) {
  const int32_t code = codecDtype(t);
  TORCH_CHECK_VALUE(code >= 0, "[qcomm] codec: dtype ", t, " is not fp32, fp16 or bf16");
  return code;
}

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

// Encode a 1-D CPU tensor with one codec: returns the wire bytes.
at::Tensor codecEncode(const at::Tensor& x, int bits, int groupSize, bool symmetric,
                       py::object noiseSalt, int64_t noiseBase) {
  TORCH_CHECK_VALUE(x.device().is_cpu(), "[qcomm] codec: CPU tensors only");
  at::Tensor c = x.contiguous().view({-1});
  const CodecSpec spec = makeSpec(bits, groupSize, symmetric, c.scalar_type());
  at::Tensor out = at::empty({encodedBytes(c.numel(), spec)}, at::kByte);  // every byte is written
  const Noise noise = noiseOf(noiseSalt, noiseBase);
  encodeBlock(c.data_ptr(), dtypeCode(c.scalar_type()), c.numel(), spec, out.data_ptr<uint8_t>(),
              noise);
  return out;
}

// Decode wire bytes of n elements to fp32.
at::Tensor codecDecode(const at::Tensor& bytes, int64_t n, int bits, int groupSize, bool symmetric,
                       at::ScalarType raw) {
  const CodecSpec spec = makeSpec(bits, groupSize, symmetric, raw);
  TORCH_CHECK_VALUE(bytes.scalar_type() == at::kByte && bytes.numel() == encodedBytes(n, spec),
                    "[qcomm] codec: expected ", encodedBytes(n, spec), " bytes");
  at::Tensor b = bytes.contiguous();
  at::Tensor out = at::empty({n}, at::kFloat);
  decodeBlock(b.data_ptr<uint8_t>(), n, spec, out.data_ptr<float>(), false);
  return out;
}

// One ring hop through the CodecOps of local's device (CPU loops or CUDA kernels on the current
// stream): partial = decode(src) + local, dst = encode(partial). Both codecs carry local's dtype
// as their raw dtype, as a plan's do. Returns (partial, dst).
std::tuple<at::Tensor, at::Tensor> codecOpsHop(const at::Tensor& src, int inBits,
                                               const at::Tensor& local, int outBits, int groupSize,
                                               bool symmetric, py::object noiseSalt,
                                               int64_t noiseBase) {
  const c10::DeviceGuard guard(local.device());
  at::Tensor l = local.contiguous().view({-1});
  const int64_t n = l.numel();
  const CodecSpec in = makeSpec(inBits, groupSize, symmetric, l.scalar_type());
  const CodecSpec out = makeSpec(outBits, groupSize, symmetric, l.scalar_type());
  TORCH_CHECK_VALUE(src.device() == l.device() && src.scalar_type() == at::kByte &&
                        src.numel() == encodedBytes(n, in),
                    "[qcomm] hop: expected ", encodedBytes(n, in), " bytes on ", l.device());
  at::Tensor s = src.contiguous();
  at::Tensor partial = at::empty({n}, l.options().dtype(at::kFloat));
  at::Tensor dst = at::empty({encodedBytes(n, out)}, l.options().dtype(at::kByte));
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

QuantConfig configFromArgs(int algorithm, int rsBits, int agBits, int groupSize, bool symmetric,
                           int64_t minBytes, int microshards, bool rotate, bool stochastic) {
  QuantConfig c;
  c.algorithm = algorithm;
  c.rsBits = rsBits;
  c.agBits = agBits;
  c.groupSize = groupSize;
  c.symmetric = symmetric;
  c.minBytes = minBytes;
  c.microshards = microshards;
  c.rotate = rotate;
  c.stochasticRounding = stochastic;
  validateConfig(c);
  return c;
}

py::dict configToDict(const QuantConfig& c) {
  py::dict d;
  d["algorithm"] = c.algorithm;
  d["rs_bits"] = c.rsBits;
  d["ag_bits"] = c.agBits;
  d["group_size"] = c.groupSize;
  d["symmetric"] = c.symmetric;
  d["min_bytes"] = c.minBytes;
  d["microshards"] = c.microshards;
  d["rotate"] = c.rotate;
  d["stochastic_rounding"] = c.stochasticRounding;
  return d;
}

// The plan of an emulated CUDA-IPC call: one contiguous CPU input and one equal uint8 buffer per
// rank (at least 2), a config that quantizes with two_step without rotation.
Plan emulatedPlan(const char* what, const std::vector<at::Tensor>& inputs,
                  const std::vector<at::Tensor>& buffers, py::tuple cfg, bool average,
                  uint32_t callSeq) {
  const int world = int(inputs.size());
  TORCH_CHECK_VALUE(world >= 2 && buffers.size() == inputs.size(), what,
                    ": one input and one buffer per rank, at least 2 ranks");
  const QuantConfig c =
      configFromArgs(cfg[0].cast<int>(), cfg[1].cast<int>(), cfg[2].cast<int>(), cfg[3].cast<int>(),
                     cfg[4].cast<bool>(), cfg[5].cast<int64_t>(), cfg[6].cast<int>(),
                     cfg[7].cast<bool>(), cfg[8].cast<bool>());
  CallFacts f;
  f.numel = inputs[0].numel();
  f.dtype = dtypeCode(inputs[0].scalar_type());
  f.opSum = !average;
  f.opAvg = average;
  f.world = world;
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
  TORCH_CHECK_VALUE(plan.quantize && plan.algorithm == kTwoStep && !plan.rotate, what,
                    ": the config must quantize with two_step, no rotation");
  plan.callSeq = callSeq;
  return plan;
}

std::vector<uint8_t*> bufferPointers(std::vector<at::Tensor>& buffers) {
  std::vector<uint8_t*> p;
  for (auto& b : buffers) p.push_back(b.data_ptr<uint8_t>());
  return p;
}

// The fused CUDA-IPC two_step's protocol run on host memory, one thread per rank of `ranks`
// (default all; each as `blocks` threads, as the kernel's blocks), in place on `inputs` (one
// CPU tensor per rank) over `buffers` (one zeroed byte tensor per rank, kept by the caller
// across calls so epochs carry on). For the CPU tests.
std::vector<at::Tensor> ipcEmulate(std::vector<at::Tensor> inputs, std::vector<at::Tensor> buffers,
                                   py::tuple cfg, bool average, uint32_t callSeq, int64_t timeoutMs,
                                   std::vector<int> ranks, int blocks, int64_t tileElems) {
  const int world = int(inputs.size());
  const Plan plan = emulatedPlan("ipc_two_step_emulate", inputs, buffers, cfg, average, callSeq);
  std::string why;
  const IpcGeometry g =
      ipcGeometry(plan.chunkElems, plan.rs, plan.ag, world, buffers[0].numel(), &why, tileElems);
  TORCH_CHECK_VALUE(why.empty(), "ipc_two_step_emulate: ", why);
  if (ranks.empty()) {
    for (int r = 0; r < world; ++r) ranks.push_back(r);
  }
  IpcError error{};
  const int64_t missesBefore = ipcEmulatedPrefetchMisses();
  std::vector<IpcTwoStepArgs> args(ranks.size());
  std::vector<uint8_t*> bufferPtrs = bufferPointers(buffers);
  {
    py::gil_scoped_release noGil;
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ranks.size(); ++i) {
      const int r = ranks[i];
      IpcTwoStepArgs& a = args[i];
      a = ipcArgs(plan, r, g, inputs[r].data_ptr(), bufferPtrs.data(), timeoutMs * 1000000, &error);
      threads.emplace_back([&a, blocks]() { ipcTwoStepEmulate(a, blocks); });
    }
    for (auto& t : threads) t.join();
  }
  TORCH_CHECK(error.code == 0, rankPrefix(int(error.rank), world), describeIpcError(error));
  const int64_t misses = ipcEmulatedPrefetchMisses() - missesBefore;
  TORCH_CHECK(misses == 0, "ipc_two_step_emulate: ", misses,
              " input tiles named for prefetching were not the next encoded (ipc_protocol.h, "
              "nextEncode)");
  return inputs;
}

// CPU memory that this thread allocated through c10's CPU allocator (at::empty) while
// ipc_separate_emulate counts: a call must allocate nothing once its first exchange has begun
// (with CUDA IPC and ranks as threads, an allocation that synchronises the device could wait for
// a peer's barrier kernel, which waits for this rank; Collective allocates with the call).
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

// The separate kernels' exchange on host buffers (HostCopies, ipc_host.h) for the collective path.
class HostIpcExchange final : public ByteExchange {
 public:
  HostIpcExchange(const IpcTwoStepArgs& a, const IpcExchangeGeometry& g)
      : copies_{a}, x_(copies_, g, copies_.a.buffers, a.rank, a.world) {}
  // CPU allocations of this thread since its first exchange began (-1: none began)
  int64_t allocationsSinceFirstExchange() const {
    return first_ < 0 ? -1 : tlCpuAllocations - first_;
  }
  void allToAll(at::Tensor& out, at::Tensor& in, const char* what, const uint8_t** parts) override {
    if (first_ < 0) first_ = tlCpuAllocations;
    check(x_.run(out.data_ptr<uint8_t>(), in.data_ptr<uint8_t>(), in.numel() / copies_.a.world,
                 false, parts),
          what);
  }
  void allGather(at::Tensor& out, at::Tensor& in, const char* what,
                 const uint8_t** parts) override {
    if (first_ < 0) first_ = tlCpuAllocations;
    check(x_.run(out.data_ptr<uint8_t>(), in.data_ptr<uint8_t>(), in.numel(), true, parts), what);
  }

 private:
  int64_t first_ = -1;
  // the record itself is read after every rank's thread has ended
  void check(bool ok, const char* what) {
    TORCH_CHECK(ok, rankPrefix(copies_.a.rank, copies_.a.world), what, ": a barrier gave up");
  }
  HostCopies copies_;
  ipc::Exchange<HostCopies> x_;
};

// The separate-kernels two_step over CUDA IPC (QCOMM_IPC_KERNELS=separate) run on host memory:
// the collective path's two_step with the CPU codec, its bytes exchanged through `buffers` (one
// zeroed byte tensor per rank, kept across calls so the barrier counts carry on) by the schedule
// of ipc_exchange.h, one thread per rank of `ranks` (default all), in place on `inputs`.
std::vector<at::Tensor> ipcSeparateEmulate(std::vector<at::Tensor> inputs,
                                           std::vector<at::Tensor> buffers, py::tuple cfg,
                                           bool average, uint32_t callSeq, int64_t timeoutMs,
                                           std::vector<int> ranks) {
  const int world = int(inputs.size());
  const Plan plan = emulatedPlan("ipc_separate_emulate", inputs, buffers, cfg, average, callSeq);
  std::string why;
  const IpcExchangeGeometry g = ipcExchangeGeometry(world, buffers[0].numel(), &why);
  TORCH_CHECK_VALUE(why.empty(), "ipc_separate_emulate: ", why);
  if (ranks.empty()) {
    for (int r = 0; r < world; ++r) ranks.push_back(r);
  }
  IpcError error{};
  std::vector<uint8_t*> bufferPtrs = bufferPointers(buffers);
  std::vector<std::string> failed(ranks.size());
  {
    py::gil_scoped_release noGil;
    const CountCpuAllocations counting;
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ranks.size(); ++i) {
      threads.emplace_back([&, i]() {
        const int r = ranks[i];
        try {
          const IpcTwoStepArgs a = ipcArgs(plan, r, IpcGeometry{}, inputs[r].data_ptr(),
                                           bufferPtrs.data(), timeoutMs * 1000000, &error);
          HostIpcExchange ex(a, g);
          CpuCodecOps ops;
          runTwoStepOver(plan, ex, r, inputs[r], ops);
          const int64_t late = ex.allocationsSinceFirstExchange();
          TORCH_CHECK(late == 0, rankPrefix(r, world), "ipc_separate_emulate: the call allocated ",
                      late, " time(s) after its first exchange began");
        } catch (const std::exception& e) {
          failed[i] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  TORCH_CHECK(error.code == 0, rankPrefix(int(error.rank), world), describeIpcError(error));
  for (const std::string& f : failed) TORCH_CHECK(f.empty(), f);
  return inputs;
}

}  // namespace
}  // namespace qcomm

PYBIND11_DECLARE_HOLDER_TYPE(T, qcomm::NoGilPtr<T>, true);

#ifdef QCOMM_WITH_CUDA
namespace qcomm {
void registerCudaOps(py::module& m);  // cuda_ops.cpp
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace qcomm;
  m.doc() = "qcomm: quantized allreduce backend (qnccl) for torch.distributed";
  py::object backendBase = py::module::import("torch._C._distributed_c10d").attr("Backend");

  py::class_<QncclBackend, NoGilPtr<QncclBackend>>(m, "QncclBackend", backendBase)
      .def(py::init([](int rank, int size, std::chrono::milliseconds timeout, py::object gloo,
                       py::object nccl, py::tuple cfg, py::object store) {
             auto asBackend = [](py::object o) -> c10::intrusive_ptr<c10d::Backend> {
               if (o.is_none()) return {};
               return c10::intrusive_ptr<c10d::Backend>::reclaim_copy(o.cast<c10d::Backend*>());
             };
             QuantConfig c =
                 configFromArgs(cfg[0].cast<int>(), cfg[1].cast<int>(), cfg[2].cast<int>(),
                                cfg[3].cast<int>(), cfg[4].cast<bool>(), cfg[5].cast<int64_t>(),
                                cfg[6].cast<int>(), cfg[7].cast<bool>(), cfg[8].cast<bool>());
             c10::intrusive_ptr<c10d::Store> st;
             if (!store.is_none()) {
               st = c10::intrusive_ptr<c10d::Store>::reclaim_copy(store.cast<c10d::Store*>());
             }
             return c10::make_intrusive<QncclBackend>(rank, size, timeout, asBackend(gloo),
                                                      asBackend(nccl), c, st);
           }),
           py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("gloo"), py::arg("nccl"),
           py::arg("config"), py::arg("store") = py::none())
      .def("cuda_transport", &QncclBackend::cudaTransport)
      .def("cuda_transport_note", &QncclBackend::cudaTransportNote)
      .def("cuda_ipc_kernels", &QncclBackend::cudaIpcKernels)
      .def("cuda_ipc_profile", &QncclBackend::cudaIpcProfile)
      .def(
          "set_config",
          [](QncclBackend& b, py::tuple cfg) {
            b.setConfig(configFromArgs(cfg[0].cast<int>(), cfg[1].cast<int>(), cfg[2].cast<int>(),
                                       cfg[3].cast<int>(), cfg[4].cast<bool>(),
                                       cfg[5].cast<int64_t>(), cfg[6].cast<int>(),
                                       cfg[7].cast<bool>(), cfg[8].cast<bool>()));
          },
          py::arg("config"))
      .def("get_config", [](const QncclBackend& b) { return configToDict(b.getConfig()); })
      .def("stats",
           [](const QncclBackend& b) {
             py::dict d;
             d["quantized_calls"] = b.stats().quantizedCalls.load();
             d["passthrough_calls"] = b.stats().passthroughCalls.load();
             d["input_bytes"] = b.stats().inputBytes.load();
             d["wire_bytes"] = b.stats().wireBytes.load();
             d["next_call_seq"] = b.nextCallSeq();
             return d;
           })
      .def("reset_stats", &QncclBackend::resetStats)
      .def(
          "plan",
          [](const QncclBackend& b, const at::Tensor& t, c10d::ReduceOp op) {
            const Plan p = b.planFor(t, op);
            py::dict d;
            d["quantize"] = p.quantize;
            d["reason"] = p.reason;
            d["algorithm"] = std::string(algoName(p.quantize ? p.algorithm : kAlgoNone));
            d["rs_bits"] = p.rs.bits;
            d["ag_bits"] = p.ag.bits;
            d["chunk_elems"] = p.chunkElems;
            d["microshards"] = p.microshards;
            d["rotate"] = p.rotate;
            d["stochastic_rounding"] = p.stochastic;
            d["shard_elems"] = p.shardElems;
            return d;
          },
          py::arg("tensor"), py::arg("op"));

  // test-only hooks
  py::module testing = m.def_submodule("_testing", "test-only hooks (not a public API)");
  py::class_<RecordingBackend, NoGilPtr<RecordingBackend>>(testing, "RecordingBackend", backendBase)
      .def(py::init([](py::object inner) {
             return c10::make_intrusive<RecordingBackend>(
                 c10::intrusive_ptr<c10d::Backend>::reclaim_copy(inner.cast<c10d::Backend*>()));
           }),
           py::arg("inner"))
      .def("log", &RecordingBackend::log)
      .def("clear", &RecordingBackend::clear);
  m.def("codec_encode", &codecEncode, py::arg("x"), py::arg("bits"), py::arg("group_size"),
        py::arg("symmetric"), py::arg("noise_salt") = py::none(), py::arg("noise_base") = 0);
  // test hook of the collective (NCCL-ready) path; not wired into allreduce yet
  m.def("collective_allreduce_for_test", &collectiveAllreduceForTest, py::arg("backend"),
        py::arg("tensor"), py::arg("avg") = false, py::arg("force_world1") = false,
        py::arg("call_seq") = -1, py::arg("timeout") = std::chrono::milliseconds(300000),
        py::call_guard<py::gil_scoped_release>());
  m.def("codec_ops_hop", &codecOpsHop, py::arg("src"), py::arg("in_bits"), py::arg("local"),
        py::arg("out_bits"), py::arg("group_size"), py::arg("symmetric"),
        py::arg("noise_salt") = py::none(), py::arg("noise_base") = 0);
  m.def("noise_salt", &noiseSalt, py::arg("call_seq"), py::arg("rank"), py::arg("phase"));
  m.def("codec_decode", &codecDecode, py::arg("bytes"), py::arg("numel"), py::arg("bits"),
        py::arg("group_size"), py::arg("symmetric"), py::arg("raw_dtype") = at::kFloat);
  m.def("cast_from_float", &castFloat, py::arg("x"), py::arg("dtype"));
  // the CPU codec loops' instruction set (codec_cpu.h): those this CPU has, the one in use, and a
  // switch (tests and benchmarks compare them; users set QCOMM_CPU_ISA)
  m.def("cpu_isas", &cpuIsas);
  m.def("cpu_isa", &cpuIsa);
  m.def("set_cpu_isa", &setCpuIsa, py::arg("name"));
  m.def("live_backends", &QncclBackend::liveCount,
        "QncclBackend objects alive in this process (for tests of group destruction)");
  m.def("cast_to_float", &castToFloatT, py::arg("x"));
  m.def("ipc_two_step_emulate", &ipcEmulate, py::arg("inputs"), py::arg("buffers"),
        py::arg("config"), py::arg("average") = false, py::arg("call_seq") = 0,
        py::arg("timeout_ms") = 60000, py::arg("ranks") = std::vector<int>{}, py::arg("blocks") = 1,
        py::arg("tile_elems") = kIpcTileElems);
  m.def("ipc_separate_emulate", &ipcSeparateEmulate, py::arg("inputs"), py::arg("buffers"),
        py::arg("config"), py::arg("average") = false, py::arg("call_seq") = 0,
        py::arg("timeout_ms") = 60000, py::arg("ranks") = std::vector<int>{});
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
  m.def(
      "ipc_geometry",
      [](int64_t chunkElems, int rsBits, int agBits, int groupSize, bool symmetric,
         at::ScalarType dtype, int world, int64_t bufferBytes, int64_t tileElems) {
        const int32_t raw = dtypeCode(dtype);
        std::string why;
        const IpcGeometry g =
            ipcGeometry(chunkElems, CodecSpec{rsBits, groupSize, symmetric ? 1 : 0, raw},
                        CodecSpec{agBits, groupSize, symmetric ? 1 : 0, raw}, world, bufferBytes,
                        &why, tileElems);
        py::dict d;
        d["tile_elems"] = g.tileElems;
        d["slot_bytes"] = g.slotBytes;
        d["tiles_per_chunk"] = g.tilesPerChunk;
        d["piece_tiles"] = g.pieceTiles;
        d["pieces"] = g.pieces;
        d["data_offset"] = kIpcDataOffset;
        d["max_slots"] = kIpcMaxSlots;
        d["error"] = why;
        return d;
      },
      py::arg("chunk_elems"), py::arg("rs_bits"), py::arg("ag_bits"), py::arg("group_size"),
      py::arg("symmetric"), py::arg("dtype"), py::arg("world"), py::arg("buffer_bytes"),
      py::arg("tile_elems") = kIpcTileElems);
  m.def("encoded_bytes", [](int64_t n, int bits, int groupSize, bool symmetric) {
    return encodedBytes(n, CodecSpec{bits, groupSize, symmetric ? 1 : 0, kFloat32});
  });
#ifdef QCOMM_WITH_CUDA
  registerCudaOps(m);
#endif
  m.def("cuda_archs", []() {
    // the compute capabilities the CUDA kernels were compiled for (setup.py QCOMM_CUDA_ARCHS)
    std::vector<int> archs;
#ifdef QCOMM_CUDA_SM70
    archs.push_back(70);
#endif
#ifdef QCOMM_CUDA_SM75
    archs.push_back(75);
#endif
#ifdef QCOMM_CUDA_SM80
    archs.push_back(80);
#endif
#ifdef QCOMM_CUDA_SM86
    archs.push_back(86);
#endif
#ifdef QCOMM_CUDA_SM89
    archs.push_back(89);
#endif
#ifdef QCOMM_CUDA_SM90
    archs.push_back(90);
#endif
#ifdef QCOMM_CUDA_SM100
    archs.push_back(100);
#endif
#ifdef QCOMM_CUDA_SM120
    archs.push_back(120);
#endif
    return archs;
  });
  m.def("compiled_with_cuda", []() {
#ifdef QCOMM_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
}
