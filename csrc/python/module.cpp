// Python bindings of qcomm._C: the backend class, its configuration and statistics, the settings,
// the codec (python/codec.cpp), and what the build holds. Every binding here is behind a
// documented function of qcomm/ (docs/api.md). The test hooks are a module of their own,
// qcomm._testing (csrc/testing/), built for the tests only and linked against this one: nothing
// for tests is in a user's qcomm._C.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include "backend/backend.h"
#include "codec/codec_cpu.h"
#include "common/settings.h"
#include "plan/tuning.h"
#include "python/codec.h"
#include "python/convert.h"
#include "python/holder.h"

namespace py = pybind11;

namespace qcomm {
namespace {

// What qcomm.plan returns of a plan (the sharded form adds its collective and factor).
py::dict planDict(const Plan& p) {
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
}

py::dict valueToDict(const settings::Value& v) {
  py::dict d;
  d["text"] = v.text;
  d["number"] = v.number;
  d["from_environment"] = v.fromEnvironment;
  return d;
}

// Every declared setting, as declared.
py::list declaredSettings() {
  py::list out;
  for (const settings::Declaration& decl : settings::declarations()) {
    py::dict d;
    d["name"] = decl.name;
    d["default"] = decl.defaultText;
    d["allowed"] = decl.allowed;
    d["doc"] = decl.doc;
    d["scope"] = decl.scope == settings::Scope::kProcess ? "process" : "group";
    d["field"] = decl.field;
    out.append(d);
  }
  return out;
}

py::list cudaArchs() {
  // the compute capabilities the CUDA kernels were compiled for (setup.py QCOMM_CUDA_ARCHS)
  py::list archs;
#ifdef QCOMM_CUDA_SM70
  archs.append(70);
#endif
#ifdef QCOMM_CUDA_SM75
  archs.append(75);
#endif
#ifdef QCOMM_CUDA_SM80
  archs.append(80);
#endif
#ifdef QCOMM_CUDA_SM86
  archs.append(86);
#endif
#ifdef QCOMM_CUDA_SM89
  archs.append(89);
#endif
#ifdef QCOMM_CUDA_SM90
  archs.append(90);
#endif
#ifdef QCOMM_CUDA_SM100
  archs.append(100);
#endif
#ifdef QCOMM_CUDA_SM120
  archs.append(120);
#endif
  return archs;
}

}  // namespace
}  // namespace qcomm

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace qcomm;
  m.doc() = "qcomm: quantized allreduce backend (qnccl) for torch.distributed";
  py::object backendBase = py::module::import("torch._C._distributed_c10d").attr("Backend");

  py::class_<QncclBackend, NoGilPtr<QncclBackend>>(
      m, "QncclBackend", backendBase,
      "The c10d backend of a qnccl group (csrc/backend/backend.h): eligible allreduces, "
      "reduce-scatters and all-gathers quantized, every other collective passed through to the "
      "inner Gloo or NCCL backend. torch creates it "
      "through qcomm._create; qcomm.backend_of(group) returns it.")
      .def(py::init([](int rank, int size, std::chrono::milliseconds timeout, py::object gloo,
                       py::object nccl, py::object cfg, py::object store, bool disabled,
                       int cpuThreads, int checkCalls) {
             c10::intrusive_ptr<c10d::Store> st;
             if (!store.is_none()) {
               st = c10::intrusive_ptr<c10d::Store>::reclaim_copy(store.cast<c10d::Store*>());
             }
             return c10::make_intrusive<QncclBackend>(rank, size, timeout, backendOf(gloo),
                                                      backendOf(nccl), configFrom(cfg), st,
                                                      disabled, cpuThreads, checkCalls);
           }),
           py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("gloo"), py::arg("nccl"),
           py::arg("config"), py::arg("store") = py::none(), py::arg("disabled") = false,
           py::arg("cpu_threads") = 0, py::arg("check_calls") = -1)
      .def("check_calls", [](const QncclBackend& b) { return b.group().checkCalls; })
      .def("cuda_transport", [](const QncclBackend& b) { return b.cudaInfo().transport; })
      .def("cuda_transport_note", [](const QncclBackend& b) { return b.cudaInfo().note; })
      .def("cuda_ipc_kernels", [](const QncclBackend& b) { return b.cudaInfo().kernels; })
      .def("cuda_ipc_profile", [](const QncclBackend& b) { return b.cudaInfo().profile; })
      .def(
          "set_config", [](QncclBackend& b, py::object cfg) { b.setConfig(configFrom(cfg)); },
          py::arg("config"))
      .def("get_config", [](const QncclBackend& b) { return configToDict(b.getConfig()); })
      .def("exchange_config", &QncclBackend::exchangeConfig, py::arg("mine"),
           py::call_guard<py::gil_scoped_release>(),
           "qcomm.set_config's agreement: every rank's config text, by rank, exchanged behind "
           "the calls issued before it")
      // reads atomics and the shadow statistics only: never waits for a running call (nor for
      // its lock, which a child forked during a call would find held forever)
      .def("stats",
           [](const QncclBackend& b) {
             const Group& g = b.group();
             const Stats& st = g.stats;
             py::dict d;
             d["quantized_calls"] = st.quantizedCalls.load();
             d["passthrough_calls"] = st.passthroughCalls.load();
             d["input_bytes"] = st.inputBytes.load();
             d["wire_bytes"] = st.wireBytes.load();
             d["next_call_seq"] = g.callSeq.load();
             d["buffer_bytes"] = g.scratchBytes();
             d["cpu_threads"] = g.cpuThreadsUsed.load();
             d["tuned_classes"] = st.tunedClasses.load();
             d["tune_seconds"] = double(st.tuneNanos.load()) * 1e-9;
             d["checked_classes"] = st.checkedClasses.load();
             d["check_seconds"] = double(st.checkNanos.load()) * 1e-9;
             d["retuned_classes"] = st.retunedClasses.load();
             py::dict shadow;
             for (const auto& kv : g.shadowStats()) {
               const ShadowStat& s = kv.second;
               py::dict e;
               e["calls"] = s.calls;
               e["rel_l2_mean"] = s.calls ? s.relL2Sum / double(s.calls) : 0.0;
               e["rel_l2_max"] = s.relL2Max;
               e["max_abs_error"] = s.maxAbs;
               e["seconds"] = s.seconds;
               shadow[py::str(kv.first)] = e;
             }
             d["shadow"] = shadow;
             py::dict by;
             for (int c : {int(kAllreduce), int(kReduceScatter), int(kAllGather)}) {
               const CollectiveStats& cs = st.byCollective[c];
               py::dict e;
               e["quantized_calls"] = cs.quantizedCalls.load();
               e["passthrough_calls"] = cs.passthroughCalls.load();
               e["input_bytes"] = cs.inputBytes.load();
               e["wire_bytes"] = cs.wireBytes.load();
               by[collectiveName(c)] = e;
             }
             d["by_collective"] = by;
             return d;
           })
      .def("tuning",
           [](const QncclBackend& b) {
             py::list out;
             for (const TuneEntry& e : b.tuner().entries()) out.append(entryToDict(e));
             return out;
           })
      .def(
          "load_tuning",
          [](QncclBackend& b, const py::list& entries) {
            std::vector<TuneEntry> es;
            for (const auto& e : entries) es.push_back(entryFromTuple(e.cast<py::tuple>()));
            b.tuner().load(es);
          },
          py::arg("entries"))
      .def(
          "set_tuning_cache",
          [](QncclBackend& b, const std::string& path, const std::string& key) {
            b.tuner().setCache(path, key);
          },
          py::arg("path"), py::arg("key"))
      .def("tuning_cache", [](const QncclBackend& b) { return b.tuner().cachePath(); })
      .def("tune", &QncclBackend::tune, py::arg("sample"), py::arg("collective") = 0,
           py::call_guard<py::gil_scoped_release>())
      .def(
          "release_buffers", [](QncclBackend& b) { return b.group().releaseScratch(); },
          py::call_guard<py::gil_scoped_release>())
      .def("reset_stats", [](QncclBackend& b) { b.group().resetStats(); })
      .def(
          "plan",
          [](const QncclBackend& b, const at::Tensor& t, c10d::ReduceOp op, bool alike) {
            return planDict(b.plan(kAllreduce, t, at::Tensor(), op, alike));
          },
          py::arg("tensor"), py::arg("op"), py::arg("alike") = true)
      .def(
          "plan_sharded",
          [](const QncclBackend& b, int collective, const at::Tensor& message,
             const at::Tensor& shard, c10d::ReduceOp op, bool alike) {
            const Plan p = b.plan(collective, message, shard, op, alike);
            py::dict d = planDict(p);
            d["collective"] = std::string(collectiveName(p.collective));
            d["premul_factor"] = p.premul ? py::object(py::float_(p.factor)) : py::none();
            return d;
          },
          py::arg("collective"), py::arg("message"), py::arg("shard"), py::arg("op"),
          py::arg("alike") = true);

  // the settings (common/settings.h): every QCOMM_* variable, read by one reader
  m.def("setting_declarations", &declaredSettings, "every QCOMM_* setting, as declared");
  m.def("config_fields", &configFields,
        "QuantConfig's fields as declared (plan/config.h): name, default (encoded), tuning_key");
  m.def(
      "setting", [](const std::string& name) { return valueToDict(settings::get(name)); },
      py::arg("name"));
  m.def(
      "parse_setting",
      [](const std::string& name, const std::string& raw) {
        return valueToDict(settings::parse(name, raw));
      },
      py::arg("name"), py::arg("raw"));

  m.def("reload_settings", &settings::reload,
        "forget the process-scoped settings read so far (qcomm.reload_settings)");

  // the CPU codec loops' instruction set (codec_cpu.h): those this CPU has, the one in use, and
  // the switch (qcomm.set_cpu_isa, as QCOMM_CPU_ISA; the benchmarks compare them)
  m.def("cpu_isas", &cpuIsas);
  m.def("cpu_isa", &cpuIsa);
  m.def("set_cpu_isa", &setCpuIsa, py::arg("name"));
  registerCodec(m);

  // the tuner's candidates (plan/tuning.h), by name, in the order it measures them
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
  m.def("cuda_archs", &cudaArchs);
  m.def("compiled_with_cuda", []() {
#ifdef QCOMM_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
  m.def("compiled_with_experiments", []() {
#ifdef QCOMM_EXPERIMENTS
    return true;
#else
    return false;
#endif
  });
}
