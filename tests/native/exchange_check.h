// The separate kernels' exchange (csrc/transport/ipc_exchange.h, ipc::CopySchedule) checked with
// any executor: W ranks as threads move random bytes through buffers so small that slots take
// several rounds (copied out) or one (left in the buffers), over several calls, each an all-to-all,
// an all-gather and then the rings' point-to-point legs (to the next rank and from the previous,
// and with 3 ranks or more the reverse too, as semi_ring's steps; messages shorter than the unit
// on some ranks); what each rank reads at its parts before its next exchange must be exactly what
// its peers sent it, the barrier counts must agree, and nothing may give up. Shared by the
// ThreadSanitizer harness (tests/native/exchange_race.cpp, the host executor) and the SIMT
// emulator's driver (tests/native/simt/exchange_main.cpp, the kernels of csrc/cuda/ipc_kernels.cu).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "testing/ipc_emulation.h"
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
    std::vector<std::vector<uint8_t>> in(static_cast<size_t>(world)),
        out = in, gin = in, gout = in, got = in, ggot = in, lin = in, lout = in, lgot = in;
    // the legs' messages: slot, slot - 5 or slot - 10 bytes (rank mod 3), in units of `slot`
    auto legBytes = [&](int r) { return std::max<int64_t>(0, slot - 5 * (r % 3)); };
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
      lin[size_t(r)].resize(size_t(2 * slot));
      for (auto& v : lin[size_t(r)]) v = uint8_t(gen());
      lout[size_t(r)].assign(size_t(2 * slot), 0);
      lgot[size_t(r)].assign(size_t(2 * slot), 0);
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
        // every rank's call has the same fingerprint (a new one each call): the first barrier
        // compares them and must pass
        ipc::CopySchedule<Copies> x(c, g, c.peers.buffers, r, world, uint32_t(call * 7919 + 1));
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
        // legs 0, 1: to the next rank, from the previous; 2, 3: to the previous, from the next
        const int next = (r + 1) % world, prev = (r + world - 1) % world;
        std::vector<ipc::Leg> legs = {{true, next, lin[size_t(r)].data(), legBytes(r)},
                                      {false, prev, lout[size_t(r)].data(), legBytes(prev)}};
        if (world >= 3) {
          legs.push_back({true, prev, lin[size_t(r)].data() + slot, legBytes(r)});
          legs.push_back({false, next, lout[size_t(r)].data() + slot, legBytes(next)});
        }
        std::vector<const uint8_t*> where(legs.size());
        done = done && x.runLegs(legs.data(), int(legs.size()), slot, where.data());
        if (done) {
          c.flush();
          for (size_t i = 1; i < legs.size(); i += 2) {
            if (legs[i].bytes > 0) {
              readPart(c, lgot[size_t(r)].data() + (i / 2) * slot, where[i], legs[i].bytes);
            }
          }
        }
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
      const int next = (r + 1) % world, prev = (r + world - 1) % world;
      const bool legsOk =
          std::memcmp(lgot[size_t(r)].data(), lin[size_t(prev)].data(), size_t(legBytes(prev))) ==
              0 &&
          (world < 3 || std::memcmp(lgot[size_t(r)].data() + slot, lin[size_t(next)].data() + slot,
                                    size_t(legBytes(next))) == 0);
      if (!legsOk) {
        std::fprintf(stderr, "%s call %zu: rank %d's legs from ranks %d and %d differ\n", what,
                     call, r, prev, next);
        return false;
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
