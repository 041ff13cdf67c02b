// The fused CUDA-IPC two_step kernel (csrc/experiments/ipc_fused/ipc_two_step.cu), run by the
// SIMT emulator with W ranks as host threads, each launching its blocks (256 threads each) over
// shared host buffers, against the host emulation of the same protocol (fused_host.cpp, which the
// CPU tests check against the reference): every rank's result bit for bit, identical across
// ranks, the device epoch words and the profile counters, several pieces per call and several
// calls carrying the epochs. Then a rank that never comes: the others must give up within the
// spin bound and record why. Exits non-zero on any difference, a missing error record, or an
// emulator error. Built and run by scripts/experiments_check.sh simt (QCOMM_EXPERIMENTS=1 only).
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "codec/codec_cpu.h"
#include "cuda/ipc_layout.h"
#include "experiments/ipc_fused/fused_host.h"
#include "experiments/ipc_fused/fused_layout.h"
#include "experiments/ipc_fused/ipc_two_step.h"
#include "plan/plan.h"

using namespace qcomm;

namespace {

struct Case {
  int world;
  int blocks;
  int32_t dtype;
  int64_t numel;
  int rsBits, agBits;
  bool symmetric, stochastic, average;
  int groupSize;
  int64_t dataBytes;  // the buffer's data region: small, so a call takes several pieces
  int calls;
  int64_t tileElems = kIpcTileElems;  // QCOMM_IPC_TILE_ELEMS
  int taskWarps = kIpcBlockWarps;     // QCOMM_IPC_TASK_WARPS
};

using Buffers = std::vector<std::vector<uint8_t>>;

std::vector<uint8_t*> pointers(Buffers& b) {
  std::vector<uint8_t*> p;
  for (auto& x : b) p.push_back(x.data());
  return p;
}

uint32_t epochWord(const std::vector<uint8_t>& buf) {
  uint32_t v;
  std::memcpy(&v, buf.data() + kIpcEpochOffset, 4);
  return v;
}

Plan planFor(const Case& k, int call) {
  QuantConfig cfg;
  cfg.algorithm = kTwoStep;
  cfg.minBytes = 0;
  cfg.rsBits = k.rsBits;
  cfg.agBits = k.agBits;
  cfg.symmetric = k.symmetric;
  cfg.groupSize = k.groupSize;
  cfg.stochasticRounding = k.stochastic;
  CallFacts f;
  f.numel = k.numel;
  f.dtype = k.dtype;
  f.opSum = !k.average;
  f.opAvg = k.average;
  f.world = k.world;
  Plan plan = makePlan(f, cfg);
  plan.callSeq = uint32_t(call);
  return plan;
}

// One case: `calls` calls through the kernel and through the host emulation, compared.
bool runCase(const Case& k, std::mt19937& gen) {
  const int W = k.world;
  const int eb = dtypeBytes(k.dtype);
  const int64_t bufferBytes = kIpcDataOffset + k.dataBytes;
  Buffers kernelBufs(size_t(W), std::vector<uint8_t>(size_t(bufferBytes), 0));
  Buffers hostBufs = kernelBufs;
  std::vector<uint8_t*> kp = pointers(kernelBufs), hp = pointers(hostBufs);
  std::normal_distribution<float> normal;
  int64_t pieces = 0;
  for (int call = 0; call < k.calls; ++call) {
    const Plan plan = planFor(k, call);
    std::string why;
    const IpcGeometry g =
        ipcGeometry(plan.chunkElems, plan.rs, plan.ag, W, bufferBytes, &why, k.tileElems);
    if (!why.empty() || g.pieces < 1) {
      std::fprintf(stderr, "geometry: %s\n", why.c_str());
      return false;
    }
    pieces = g.pieces;
    std::vector<std::vector<uint8_t>> kd(static_cast<size_t>(W)), hd(static_cast<size_t>(W));
    for (int r = 0; r < W; ++r) {
      std::vector<float> v(size_t(k.numel));
      for (float& x : v) x = normal(gen) * float(1 + r);
      // elements 1024..1279: the dtype's largest value on ranks 0 and 1, with opposite signs, so
      // the sum stays finite while each copy's group reaches the top: 127 * RN(FLT_MAX / 127)
      // rounds to Inf, which the owner's decode must clamp back to FLT_MAX
      const float top = k.dtype == kFloat32    ? 3.40282347e38f
                        : k.dtype == kBFloat16 ? 3.38953139e38f
                                               : 65504.0f;
      for (int64_t i = 1024; r < 2 && i < k.numel && i < 1280; ++i) {
        v[size_t(i)] = ((i & 1) == (r & 1) ? top : -top);
      }
      kd[size_t(r)].resize(size_t(k.numel * eb));
      castFromFloat(v.data(), k.numel, k.dtype, kd[size_t(r)].data());
      hd[size_t(r)] = kd[size_t(r)];
    }
    std::vector<IpcError> kErr(static_cast<size_t>(W)), hErr(static_cast<size_t>(W));
    // every kernel call profiles (QCOMM_IPC_PROFILE): the counters must not change any result
    std::vector<std::vector<unsigned long long>> prof(
        size_t(W), std::vector<unsigned long long>(size_t(kIpcProfileSlots), 0ull));
    std::vector<std::thread> ranks;
    for (int r = 0; r < W; ++r) {
      ranks.emplace_back([&, r]() {
        IpcTwoStepArgs a = ipcArgs(plan, r, g, kd[size_t(r)].data(), kp.data(),
                                   int64_t(120) * 1000000000, &kErr[size_t(r)]);
        a.smCount = k.blocks;
        a.taskWarps = k.taskWarps;
        a.profile = prof[size_t(r)].data();
        if (gpu::ipcTwoStep(a, nullptr) != cudaSuccess) kErr[size_t(r)].code = 99;
      });
    }
    for (auto& t : ranks) t.join();
    ranks.clear();
    for (int r = 0; r < W; ++r) {
      // every task group (taskWarps warps) ran every piece once; the phases every rank passes
      // through took some time
      const std::vector<unsigned long long>& p = prof[size_t(r)];
      const int64_t groups = kIpcBlockWarps / k.taskWarps;
      const int64_t blocksPerPiece =
          std::min<int64_t>(k.blocks, (g.pieceTiles * (W - 1) + groups - 1) / groups) * groups;
      if (p[kIpcPhases] == 0 || int64_t(p[kIpcPhases]) > blocksPerPiece * g.pieces ||
          p[kPhaseSendEncode] == 0 || p[kPhaseSumEncode] == 0 || p[kPhaseGatherDecode] == 0) {
        std::fprintf(stderr,
                     "call %d rank %d: profile counters off: runs %llu (at most %lld), send %llu, "
                     "sum %llu, gather decode %llu\n",
                     call, r, p[kIpcPhases], (long long)(blocksPerPiece * g.pieces),
                     p[kPhaseSendEncode], p[kPhaseSumEncode], p[kPhaseGatherDecode]);
        return false;
      }
    }
    for (int r = 0; r < W; ++r) {
      ranks.emplace_back([&, r]() {
        const IpcTwoStepArgs a = ipcArgs(plan, r, g, hd[size_t(r)].data(), hp.data(),
                                         int64_t(120) * 1000000000, &hErr[size_t(r)]);
        ipcTwoStepEmulate(a, k.blocks);
      });
    }
    for (auto& t : ranks) t.join();
    for (int r = 0; r < W; ++r) {
      if (kErr[size_t(r)].code != 0 || hErr[size_t(r)].code != 0) {
        std::fprintf(stderr, "call %d rank %d: kernel error %u (%s), host error %u\n", call, r,
                     kErr[size_t(r)].code, describeIpcError(kErr[size_t(r)]).c_str(),
                     hErr[size_t(r)].code);
        return false;
      }
      if (kd[size_t(r)] != hd[size_t(r)]) {
        size_t i = 0;
        while (kd[size_t(r)][i] == hd[size_t(r)][i]) ++i;
        std::fprintf(stderr, "call %d rank %d: kernel and host emulation differ at byte %zu\n",
                     call, r, i);
        return false;
      }
      if (kd[size_t(r)] != kd[0]) {
        std::fprintf(stderr, "call %d: rank %d's result differs from rank 0's\n", call, r);
        return false;
      }
      if (epochWord(kernelBufs[size_t(r)]) != epochWord(hostBufs[size_t(r)])) {
        std::fprintf(stderr, "call %d rank %d: epoch %u on the kernel's side, %u on the host's\n",
                     call, r, epochWord(kernelBufs[size_t(r)]), epochWord(hostBufs[size_t(r)]));
        return false;
      }
    }
  }
  std::printf(
      "W=%d blocks=%d task_warps=%d %s numel=%lld rs=%d ag=%d sym=%d stochastic=%d avg=%d "
      "group=%d tile=%lld: %d calls, %lld pieces each, epoch %u: identical to the host "
      "emulation\n",
      W, k.blocks, k.taskWarps,
      k.dtype == kFloat32 ? "f32" : (k.dtype == kFloat16 ? "f16" : "bf16"), (long long)k.numel,
      k.rsBits, k.agBits, int(k.symmetric), int(k.stochastic), int(k.average), k.groupSize,
      (long long)k.tileElems, k.calls, (long long)pieces, epochWord(kernelBufs[0]));
  return true;
}

// Rank W-1 never calls: every other rank must give up within the bound and record it.
bool runMissingRank() {
  const Case k{3, 2, kFloat32, 50000, 8, 8, false, false, false, 128, 64 << 10, 1};
  const int W = k.world;
  const int64_t bufferBytes = kIpcDataOffset + k.dataBytes;
  Buffers bufs(size_t(W), std::vector<uint8_t>(size_t(bufferBytes), 0));
  std::vector<uint8_t*> p = pointers(bufs);
  const Plan plan = planFor(k, 0);
  std::string why;
  const IpcGeometry g = ipcGeometry(plan.chunkElems, plan.rs, plan.ag, W, bufferBytes, &why);
  std::vector<std::vector<float>> data(size_t(W), std::vector<float>(size_t(k.numel), 1.0f));
  std::vector<IpcError> err(static_cast<size_t>(W));
  const int64_t timeoutNs = 300 * 1000000LL;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> ranks;
  for (int r = 0; r + 1 < W; ++r) {
    ranks.emplace_back([&, r]() {
      IpcTwoStepArgs a =
          ipcArgs(plan, r, g, data[size_t(r)].data(), p.data(), timeoutNs, &err[size_t(r)]);
      a.smCount = k.blocks;
      gpu::ipcTwoStep(a, nullptr);
    });
  }
  for (auto& t : ranks) t.join();
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  bool timedOutOnMissing = false;
  for (int r = 0; r + 1 < W; ++r) {
    const IpcError& e = err[size_t(r)];
    if (e.code == 0) {
      std::fprintf(stderr, "missing rank: rank %d recorded no error\n", r);
      return false;
    }
    if (e.rank != uint32_t(r)) {
      std::fprintf(stderr, "missing rank: rank %d's record names rank %u\n", r, e.rank);
      return false;
    }
    if (e.code == 1 && e.peer == uint32_t(W - 1)) timedOutOnMissing = true;
    std::printf("missing rank: rank %d: %s\n", r, describeIpcError(e).c_str());
  }
  if (!timedOutOnMissing) {
    std::fprintf(stderr, "missing rank: nobody timed out waiting for rank %d\n", W - 1);
    return false;
  }
  std::printf("missing rank: every present rank gave up in %.2f s (bound %.2f s)\n", secs,
              double(timeoutNs) / 1e9);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  std::mt19937 gen(5);
  std::vector<Case> cases = {
      // world, blocks, dtype, numel, rs, ag, sym, stochastic, avg, group, data bytes, calls
      {2, 2, kFloat32, 70001, 8, 8, false, false, false, 128, 64 << 10, 3},
      {3, 2, kFloat32, 70001, 8, 8, false, false, false, 128, 64 << 10, 2},
      {4, 3, kBFloat16, 60000, 4, 8, true, false, false, 128, 64 << 10, 2},
      {3, 1, kFloat16, 25003, 8, 4, false, true, true, 64, 128 << 10, 2},
      // symmetric 8-bit fp32: copies whose groups reach FLT_MAX decode through the clamp
      {2, 3, kFloat32, 90001, 8, 8, true, false, false, 128, 256 << 10, 2, 16384},
      // task groups of one warp (QCOMM_IPC_TASK_WARPS=1): 8 independent groups per block
      {2, 2, kFloat32, 90001, 8, 8, false, false, false, 128, 256 << 10, 2, kIpcTileElems, 1},
      // groups of two warps: 4 per block, each at its own named barrier
      {4, 2, kBFloat16, 60000, 4, 8, true, false, true, 128, 64 << 10, 2, kIpcTileElems, 2},
  };
  if (!quick) {
    cases.push_back({5, 2, kFloat32, 41000, 8, 0, false, false, false, 1024, 256 << 10, 2});
    cases.push_back({8, 1, kBFloat16, 33000, 8, 8, true, false, false, 32, 256 << 10, 2});
    cases.push_back({2, 4, kFloat32, 1000, 4, 4, false, false, true, 256, 64 << 10, 2});
    cases.push_back({3, 2, kBFloat16, 30000, 0, 8, false, false, false, 128, 256 << 10, 2});
    cases.push_back({4, 2, kBFloat16, 30001, 4, 4, true, false, true, 1024, 64 << 10, 2, 1024});
    cases.push_back({3, 1, kFloat16, 25003, 8, 4, false, true, false, 64, 128 << 10, 2, 16384, 4});
    // AVG over 3 ranks (a division that is not a power-of-two scaling) and stochastic rounding,
    // with one codec for both phases: the sums of whole slabs in registers (sumEncodeSlab)
    cases.push_back({3, 2, kFloat32, 70001, 8, 8, false, true, true, 128, 128 << 10, 2});
  }
  for (const Case& k : cases) {
    if (!runCase(k, gen)) return 1;
  }
  if (!runMissingRank()) return 1;
  std::printf("fused two_step kernel: all cases identical to the host emulation\n");
  return 0;
}
