// The separate kernels' exchange (csrc/transport/ipc_exchange.h, ipc::CopySchedule) checked with
// any executor: W ranks as threads move random bytes through buffers so small that slots take
// several rounds (copied out) or one (left in the buffers), over several calls; what each rank
// reads at its parts before its next exchange must be exactly what its peers sent it, the barrier
// counts must agree, and nothing may give up. Shared by the ThreadSanitizer harness
// (tests/native/exchange_race.cpp, the host executor) and the SIMT emulator's driver
// (tests/native/simt/exchange_main.cpp, the kernels of csrc/cuda/ipc_kernels.cu).
#pragma once

#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "python/ipc_emulation.h"
#include "transport/ipc_exchange.h"

namespace qcomm {

// The host executor reads a part with memcpy (the kernels' executor has its own overload: a part
// on the "device" is read through a copy kernel).
inline void readPart(HostCopies&, uint8_t* into, const uint8_t* part, int64_t bytes) {
  std::memcpy(into, part, size_t(bytes));
}

// Runs one call per entry of `slots` (bytes per slot) with an executor `Copies{peers}` per rank
// (its IpcPeers in `peers`) over buffers whose halves hold `part` bytes per rank. Prints one line
// per call naming `what`; false (and a line on stderr) on the first problem.
template <class Copies>
bool exchangeCalls(const char* what, int world, int64_t part, const std::vector<int64_t>& slots) {
  const IpcExchangeGeometry g =
      ipcExchangeGeometry(world, kIpcDataOffset + 2 * int64_t(world) * part, nullptr);
  if (g.roundBytes != part) {
    std::fprintf(stderr, "%s: round of %lld bytes, not %lld\n", what, (long long)g.roundBytes,
                 (long long)part);
    return false;
  }
  std::vector<std::vector<uint8_t>> buffers(
      size_t(world), std::vector<uint8_t>(size_t(kIpcDataOffset + 2 * g.halfBytes), 0));
  std::vector<IpcError> err(static_cast<size_t>(world));
  for (size_t call = 0; call < slots.size(); ++call) {
    const int64_t slot = slots[call];
    std::vector<std::vector<uint8_t>> in(static_cast<size_t>(world)), out = in, gin = in, gout = in,
                                                                      got = in, ggot = in;
    std::mt19937 gen{uint32_t(call)};
    for (int r = 0; r < world; ++r) {
      in[size_t(r)].resize(size_t(world * slot));
      gin[size_t(r)].resize(size_t(slot));
      for (auto& v : in[size_t(r)]) v = uint8_t(gen());
      for (auto& v : gin[size_t(r)]) v = uint8_t(gen());
      out[size_t(r)].assign(size_t(world * slot), 0);
      gout[size_t(r)].assign(size_t(world * slot), 0);
      got[size_t(r)].assign(size_t(world * slot), 0);
      ggot[size_t(r)].assign(size_t(world * slot), 0);
    }
    std::vector<char> ok(size_t(world), 0);
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back([&, r]() {
        IpcPeers p{};
        p.world = world;
        p.rank = r;
        for (int q = 0; q < world; ++q) p.buffers[q] = buffers[size_t(q)].data();
        p.timeoutNs = int64_t(120) * 1000000000;
        p.hostError = &err[size_t(r)];
        Copies c{p};
        ipc::CopySchedule<Copies> x(c, g, c.peers.buffers, r, world);
        std::vector<const uint8_t*> parts(static_cast<size_t>(world));
        // what the caller does before the next exchange: read every part where it lies (a slot
        // of one round stays in the buffers), here into got / ggot
        auto take = [&](std::vector<uint8_t>& into) {
          c.flush();
          for (int q = 0; q < world; ++q) readPart(c, into.data() + q * slot, parts[q], slot);
        };
        bool done = x.begin() &&
                    x.run(out[size_t(r)].data(), in[size_t(r)].data(), slot, false, parts.data());
        if (done) take(got[size_t(r)]);
        done =
            done && x.run(gout[size_t(r)].data(), gin[size_t(r)].data(), slot, true, parts.data());
        if (done) take(ggot[size_t(r)]);
        ok[size_t(r)] = done && c.failure()[0] == '\0';
      });
    }
    for (auto& t : ranks) t.join();
    uint32_t count0 = 0;
    for (int r = 0; r < world; ++r) {
      if (!ok[size_t(r)] || err[size_t(r)].code != 0) {
        std::fprintf(stderr, "%s call %zu rank %d: a launch failed or a barrier gave up (%s)\n",
                     what, call, r, describeIpcError(err[size_t(r)]).c_str());
        return false;
      }
      for (int q = 0; q < world; ++q) {
        if (std::memcmp(got[size_t(r)].data() + q * slot, in[size_t(q)].data() + r * slot,
                        size_t(slot)) != 0 ||
            std::memcmp(ggot[size_t(r)].data() + q * slot, gin[size_t(q)].data(), size_t(slot)) !=
                0) {
          std::fprintf(stderr, "%s call %zu: rank %d's bytes from rank %d differ\n", what, call, r,
                       q);
          return false;
        }
      }
      uint32_t count;
      std::memcpy(&count, buffers[size_t(r)].data() + kIpcBarrierCountOffset, 4);
      if (r == 0) count0 = count;
      if (count != count0) {
        std::fprintf(stderr, "%s call %zu: barrier counts %u and %u\n", what, call, count0, count);
        return false;
      }
    }
    std::printf(
        "%s: call %zu, %lld bytes per slot, %d ranks, %u barriers so far: every byte "
        "delivered\n",
        what, call, (long long)slot, world, count0);
  }
  return true;
}

}  // namespace qcomm
