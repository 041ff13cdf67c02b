// ThreadSanitizer harness for the fused two_step experiment's protocol
// (csrc/experiments/ipc_fused/ipc_protocol.h) as its host emulation runs it (fused_host.cpp): W
// ranks x B blocks as threads over shared host buffers, several pieces per call, several calls
// carrying the epochs. TSan reports any pair of accesses to a slot that the flags'
// release/acquire pairs do not order, the class of bug the GPU kernel would share. Built and run
// by scripts/experiments_check.sh tsan (QCOMM_EXPERIMENTS=1 only); exits non-zero on a race
// (TSan) or when ranks disagree. (The separate kernels' exchange: tests/native/exchange_race.cpp.)
#include <ATen/Parallel.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cuda/ipc_layout.h"
#include "experiments/ipc_fused/fused_host.h"
#include "experiments/ipc_fused/fused_layout.h"
#include "plan/plan.h"

using namespace qcomm;

int main() {
  at::set_num_threads(1);  // torch's own threads are not instrumented: keep the codec inline
  const int world = 4, blocks = 3, calls = 4;
  const int64_t bufferBytes = 512 << 10;
  std::vector<std::vector<uint8_t>> buffers(world, std::vector<uint8_t>(bufferBytes, 0));
  std::vector<uint8_t*> ptrs;
  for (auto& b : buffers) ptrs.push_back(b.data());
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  for (int call = 0; call < calls; ++call) {
    const int64_t numel = call % 2 ? 180001 : 250003;
    QuantConfig cfg;
    cfg.algorithm = kTwoStep;
    cfg.minBytes = 0;
    cfg.rsBits = call == 2 ? 4 : 8;
    cfg.stochasticRounding = call == 3;
    CallFacts f;
    f.numel = numel;
    f.dtype = kFloat32;
    f.opSum = true;
    f.world = world;
    Plan plan = makePlan(f, cfg);
    plan.callSeq = uint32_t(call);
    std::string why;
    const IpcGeometry g = ipcGeometry(plan.chunkElems, plan.rs, plan.ag, world, bufferBytes, &why);
    if (!why.empty() || g.pieces < 2) {
      std::fprintf(stderr, "geometry: %s (pieces %lld)\n", why.c_str(), (long long)g.pieces);
      return 2;
    }
    std::vector<std::vector<float>> data(world, std::vector<float>(size_t(numel)));
    for (auto& d : data) {
      for (float& v : d) v = normal(gen);
    }
    IpcError error{};
    std::vector<IpcTwoStepArgs> args;
    for (int r = 0; r < world; ++r) {
      args.push_back(
          ipcArgs(plan, r, g, data[r].data(), ptrs.data(), int64_t(60) * 1000000000, &error));
    }
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back([&args, r]() { ipcTwoStepEmulate(args[size_t(r)], blocks); });
    }
    for (auto& t : ranks) t.join();
    if (error.code != 0) {
      std::fprintf(stderr, "call %d: %s\n", call, describeIpcError(error).c_str());
      return 3;
    }
    for (int r = 1; r < world; ++r) {
      if (std::memcmp(data[r].data(), data[0].data(), size_t(numel) * 4) != 0) {
        std::fprintf(stderr, "call %d: rank %d's result differs from rank 0's\n", call, r);
        return 4;
      }
    }
    std::printf("call %d: %lld elements, %lld pieces, %d ranks x %d blocks: identical\n", call,
                (long long)numel, (long long)g.pieces, world, blocks);
  }
  return 0;
}
