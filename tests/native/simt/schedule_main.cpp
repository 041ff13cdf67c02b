// The schedules (csrc/algo: two_step, ring, semi_ring; whole for an allreduce, their reduce half
// for a reduce-scatter, the gather phase alone for an all-gather) with the CUDA codec operations
// (CudaCodecOps, csrc/cuda/cuda_codec_ops.cpp over the kernels of csrc/cuda/codec_kernels.cu) run
// by the SIMT emulator, their exchanges moved by the CUDA-IPC transport's copy schedule
// (IpcExchangeTransport, csrc/transport/ipc_exchange.h) through host buffers with the host barrier
// (csrc/testing/ipc_emulation.h), one thread per rank: the backend's CUDA-IPC path with the
// separate kernels, except that the copies and barriers run on the host. The CPU tests otherwise
// run these schedules with the CPU codec only (qcomm._testing.ipc_separate_emulate); this driver is
// how the kernels meet the schedules' real call sequences (aliased partial sums, rotation, raw
// phases) without a GPU. Run by scripts/simt_check.sh schedules DIR; the comparison against
// qcomm/reference.py is tests/cuda/test_simt_schedules.py's.
//
// DIR/cases.txt holds one call per line:
//   world dtype numel average seq <the config's fields> [collective factor]
// (dtype 0 fp32, 1 fp16, 2 bf16; the fields as integers in their declared order, plan/config.h
// QCOMM_CONFIG_FIELDS, as qcomm.QuantConfig.encoded() lists them; collective 0 allreduce, 1
// reduce-scatter, 2 all-gather; factor: a reduce-scatter's PREMUL_SUM factor, 0 for none). Call i
// reads DIR/in<i>.bin (world inputs, rank after rank: numel elements each, an all-gather's
// numel / world) and writes DIR/out<i>.bin (the ranks' results in the same layout: numel
// elements each, a reduce-scatter's numel / world). Calls of one world size share their buffers
// (300 KiB per rank, or argv[2] bytes), so that their barrier counts carry on as a group's do.
// Prints one line per call; exits non-zero when a call fails (a rank's error, or a barrier that
// gave up).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "algo/algorithms.h"
#include "cuda/cuda_codec_ops.h"
#include "cuda/ipc_layout.h"
#include "plan/plan.h"
#include "testing/ipc_emulation.h"
#include "transport/ipc_exchange.h"

using namespace qcomm;

namespace {

struct Case {
  int world = 0;
  int32_t dtype = kFloat32;
  int64_t numel = 0;
  bool average = false;
  uint32_t seq = 0;
  QuantConfig cfg;
  int32_t collective = kAllreduce;
  double factor = 0;  // a reduce-scatter's PREMUL_SUM factor (0: SUM or AVG)
  int64_t inNumel() const { return collective == kAllGather ? numel / world : numel; }
  int64_t outNumel() const { return collective == kReduceScatter ? numel / world : numel; }
};

bool parse(const std::string& line, Case* c) {
  std::istringstream in(line);
  int average = 0;
  in >> c->world >> c->dtype >> c->numel >> average >> c->seq;
  c->average = average != 0;
  // the config's fields in their declared order (QuantConfig.encoded().values())
#define QCOMM_READ_FIELD(type, member, name, value, key) \
  {                                                      \
    int64_t v = 0;                                       \
    in >> v;                                             \
    c->cfg.member = static_cast<type>(v);                \
  }
  QCOMM_CONFIG_FIELDS(QCOMM_READ_FIELD)
#undef QCOMM_READ_FIELD
  if (!in) return false;
  if (in >> c->collective) in >> c->factor;
  return true;
}

at::ScalarType scalarType(int32_t dtype) {
  return dtype == kFloat32 ? at::kFloat : (dtype == kFloat16 ? at::kHalf : at::kBFloat16);
}

// Runs call `c` on every rank's `data` over `buffers`, the results into `outs` (an allreduce's
// in place: outs = data); "" or the first error.
std::string runCall(const Case& c, std::vector<at::Tensor>& data, std::vector<at::Tensor>& outs,
                    std::vector<std::vector<uint8_t>>& buffers) {
  validateConfig(c.cfg);
  CallFacts f;
  f.numel = c.numel;
  f.dtype = c.dtype;
  f.opSum = !c.average && c.factor == 0;
  f.opAvg = c.average;
  f.opPremul = c.factor != 0;
  f.premulFactor = c.factor;
  f.world = c.world;
  f.collective = c.collective;
  Plan plan = makePlan(f, c.cfg);
  if (!plan.quantize) return "the config does not quantize: " + plan.reason;
  plan.callSeq = c.seq;
  std::string why;
  const IpcExchangeGeometry g = ipcExchangeGeometry(c.world, int64_t(buffers[0].size()), &why);
  if (!why.empty()) return why;
  std::vector<uint8_t*> bufferPtrs;
  for (auto& b : buffers) bufferPtrs.push_back(b.data());
  // a rotated message that ends inside a group runs on a copy padded with zeros, as the backend's
  std::vector<at::Tensor> work = data;
  for (auto& t : work) {
    if (needsPadding(plan)) t = paddedCopy(plan, t);
  }
  IpcError error{};
  std::vector<std::string> failed(size_t(c.world));
  std::vector<std::thread> threads;
  for (int r = 0; r < c.world; ++r) {
    threads.emplace_back([&, r]() {
      IpcPeers peers{};
      for (int q = 0; q < c.world; ++q) peers.buffers[q] = bufferPtrs[size_t(q)];
      peers.world = c.world;
      peers.rank = r;
      peers.timeoutNs = 120LL * 1000000000LL;  // the emulated kernels are slow; a hang still ends
      peers.hostError = &error;
      try {
        HostCopies copies;
        copies.peers = peers;
        IpcExchangeTransport<HostCopies> t(copies, g, bufferPtrs.data(), r, c.world,
                                           planFingerprint(plan));
        // the stream is the emulator's (every launch runs to its end before it returns)
        std::unique_ptr<CodecOps> ops = makeCudaCodecOps(nullptr);
        if (c.collective == kReduceScatter) {
          runReduceScatter(plan, t, *ops, work[size_t(r)], outs[size_t(r)]);
        } else if (c.collective == kAllGather) {
          // the input into this rank's slot of the message (outs), then the gather phase
          outs[size_t(r)].narrow(0, r * plan.chunkElems, plan.chunkElems).copy_(work[size_t(r)]);
          runAllGather(plan, t, *ops, outs[size_t(r)]);
        } else {
          runAllreduce(plan, t, *ops, work[size_t(r)]);
        }
      } catch (const std::exception& e) {
        failed[size_t(r)] = e.what();
      }
      at::Tensor& out = c.collective == kAllreduce ? work[size_t(r)] : outs[size_t(r)];
      ipcPoisonIfAbortedEmulate(peers, static_cast<uint8_t*>(out.data_ptr()), out.nbytes());
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < c.world; ++r) {
    if (!work[size_t(r)].is_same(data[size_t(r)])) copyUnpadded(plan, work[size_t(r)], data[r]);
  }
  if (error.code != 0) return describeIpcError(error);
  for (const std::string& e : failed) {
    if (!e.empty()) return e;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [buffer_bytes]\n", argv[0]);
    return 2;
  }
  at::set_num_threads(1);
  const std::string dir = argv[1];
  const int64_t bufferBytes = argc > 2 ? std::stoll(argv[2]) : int64_t(300) << 10;
  std::ifstream cases(dir + "/cases.txt");
  if (!cases) {
    std::fprintf(stderr, "schedules: no %s/cases.txt\n", dir.c_str());
    return 2;
  }
  std::map<int, std::vector<std::vector<uint8_t>>> buffers;  // by world size, kept across calls
  std::string line;
  int calls = 0, failures = 0;
  for (int i = 0; std::getline(cases, line); ++i) {
    if (line.empty()) continue;
    Case c;
    if (!parse(line, &c)) {
      std::fprintf(stderr, "schedules: cannot read case %d: %s\n", i, line.c_str());
      return 2;
    }
    const int64_t inBytes = c.inNumel() * dtypeBytes(c.dtype);
    const int64_t outBytes = c.outNumel() * dtypeBytes(c.dtype);
    std::vector<uint8_t> raw(size_t(inBytes) * size_t(c.world));
    std::ifstream in(dir + "/in" + std::to_string(i) + ".bin", std::ios::binary);
    if (!in.read(reinterpret_cast<char*>(raw.data()), std::streamsize(raw.size()))) {
      std::fprintf(stderr, "schedules: case %d: cannot read in%d.bin\n", i, i);
      return 2;
    }
    std::vector<at::Tensor> data, outs;
    const auto options = at::TensorOptions().dtype(scalarType(c.dtype));
    for (int r = 0; r < c.world; ++r) {
      at::Tensor t = at::empty({c.inNumel()}, options);
      std::memcpy(t.data_ptr(), raw.data() + size_t(r) * size_t(inBytes), size_t(inBytes));
      data.push_back(t);
      outs.push_back(c.collective == kAllreduce ? t : at::empty({c.outNumel()}, options));
    }
    auto& bufs = buffers[c.world];
    if (bufs.empty()) bufs.assign(size_t(c.world), std::vector<uint8_t>(size_t(bufferBytes), 0));
    std::string error;
    try {
      error = runCall(c, data, outs, bufs);
    } catch (const std::exception& e) {
      error = e.what();
    }
    ++calls;
    std::printf("call %d: %s world %d %s numel %lld %s rs %d ag %d rotate %d: %s\n", i,
                collectiveName(c.collective), c.world, algoName(c.cfg.algorithm),
                (long long)c.numel, c.average ? "avg" : (c.factor != 0 ? "premul" : "sum"),
                c.cfg.rsBits, c.cfg.agBits, c.cfg.rotate, error.empty() ? "ran" : error.c_str());
    if (!error.empty()) {
      ++failures;
      continue;
    }
    raw.resize(size_t(outBytes) * size_t(c.world));
    for (int r = 0; r < c.world; ++r) {
      std::memcpy(raw.data() + size_t(r) * size_t(outBytes), outs[size_t(r)].data_ptr(),
                  size_t(outBytes));
    }
    std::ofstream out(dir + "/out" + std::to_string(i) + ".bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(raw.data()), std::streamsize(raw.size()));
  }
  std::printf("schedules with the CUDA codec: %d calls, %d failed\n", calls, failures);
  return failures == 0 && calls > 0 ? 0 : 1;
}
