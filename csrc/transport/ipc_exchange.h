// The transport of the algorithms over the CUDA-IPC buffers (QCOMM_IPC_KERNELS=separate): their
// exchanges of encoded bytes (two_step's all-to-all and all-gather, the rings' point-to-point
// legs) done as copies through the buffers instead of NCCL, with the codec kernels of the NCCL
// path around them. CopySchedule is the schedule of those copies, written once for two executors:
// the CUDA one (gpu::ExchangeKernels, csrc/cuda/ipc_kernels.h: a copy kernel per step, up to W
// copies each, and a one-thread barrier kernel, all enqueued on the call's stream) and a host one
// (csrc/testing/ipc_emulation.h: memcpy and the same barrier on host memory, one thread per rank)
// that the CPU tests run against the reference; IpcExchangeTransport runs an algorithm's
// exchanges through it.
//
// A call starts with a barrier, before its first copy (begin(), or the first run()): every rank
// has finished reading the previous call's parts in its buffer (copies out, or the decodes that
// read them where they landed), so its peers may write into it. That barrier also compares the
// ranks' plan fingerprints: ranks whose calls differ give up there, before any copy. What the
// caller enqueues before the first exchange (its allocations, the reduce phase's encodes) comes
// before that barrier, so nothing a rank does on the host while a peer's barrier waits for it is
// part of the call. The barrier is global (every rank enters every one), and every rank runs the
// same exchanges in the same order with the same number of rounds (the plan is the same
// everywhere). Each exchange moves every rank's parts in rounds of at most roundBytes per part
// (ipcExchangeGeometry), round r through half r % 2 of the data regions, counted over the call:
//   1. copy: this rank's part for rank j into rank j's current half, at [this rank * roundBytes]
//      (all-to-all and all-gather: to every peer, in rotated order rank + 1, rank + 2, ..., and its
//      own part straight into `out`; legs: to the peer of each sending leg);
//   2. barrier: every rank has written its parts into this rank's half;
//   3. copy out: the parts from each source rank in this rank's half, at [source * roundBytes],
//      into where they belong (all-to-all and all-gather: `out` at [source * slotBytes + offset];
//      legs: the slot of the receiving leg from that peer).
// An exchange whose slots take one round (with the default 32 MiB buffer, messages of up to about
// 15.7 million elements at 8 bits, whatever W) is not copied out at all: the caller reads the parts
// where they landed (`parts`), its own in its input, before the next exchange.
// A half is written again two rounds later, after the barrier of the round between (or of the
// next call's start), which each rank enters only after its reads of that half (stream order):
// nothing is overwritten before its reader has it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "cuda/ipc_layout.h"
#include "transport/transport.h"

namespace qcomm {
namespace ipc {

// A point-to-point leg of runLegs(): `bytes` of `slot` to or from rank `peer`.
struct Leg {
  bool send;
  int peer;
  uint8_t* slot;
  int64_t bytes;
};

// Each executor `ex` provides copy(dst, src, bytes) (it may hold copies back until the next
// flush() or barrier), flush(), barrier(index, fingerprint) (after the copies before it; with a
// fingerprint, the call's first, which also compares the ranks' plan fingerprints; false: it gave
// up, the error is recorded), and failure(): why a launch failed, "" when none did.
template <class Exec>
class CopySchedule {
 public:
  // `fingerprint`: the call's plan's (planFingerprint, csrc/plan/plan.h), compared across the ranks
  // in the call's first barrier (ipc_barrier.h), before any rank writes into a peer's data region.
  CopySchedule(Exec& ex, const IpcExchangeGeometry& g, uint8_t* const* buffers, int rank, int world,
               uint32_t fingerprint = 0)
      : ex_(ex), g_(g), buffers_(buffers), rank_(rank), world_(world), fingerprint_(fingerprint) {}

  // The call's first barrier (once; the first run() enters it if begin() was not called): every
  // rank has finished with the previous call's parts, and every rank's call has this fingerprint.
  bool begin() {
    if (barriers_ > 0) return true;
    return ex_.barrier(barriers_++, &fingerprint_);
  }

  // Rank j receives slot j of every rank's `in` (world slots of slotBytes) as its slot i from
  // rank i (gather = false); or every rank's `in` (one slot) as its slot i (gather = true). On
  // return parts[i] (world pointers) says where slot i lies. A slot of one round stays where it
  // landed: the peers' parts in this rank's half, its own in `in`; the half is rewritten only
  // after the barrier of the next exchange, so what the caller enqueues before that exchange
  // reads them. Slots of several rounds are copied into `out` (world slots of slotBytes).
  bool run(uint8_t* out, const uint8_t* in, int64_t slotBytes, bool gather, const uint8_t** parts) {
    if (!begin()) return false;
    const bool inPlace = slotBytes <= g_.roundBytes;
    const uint8_t* own = in + (gather ? 0 : int64_t(rank_) * slotBytes);
    for (int q = 0; q < world_; ++q) parts[q] = out + int64_t(q) * slotBytes;
    for (int64_t off = 0; off < slotBytes; off += g_.roundBytes, ++round_) {
      const int64_t len = std::min(g_.roundBytes, slotBytes - off);
      const int64_t half = kIpcDataOffset + (round_ & 1) * g_.halfBytes;
      for (int k = 1; k < world_; ++k) {
        const int j = (rank_ + k) % world_;
        ex_.copy(buffers_[j] + half + rank_ * g_.roundBytes,
                 in + (gather ? 0 : int64_t(j) * slotBytes) + off, len);
      }
      if (!inPlace) ex_.copy(out + int64_t(rank_) * slotBytes + off, own + off, len);
      if (!ex_.barrier(barriers_++)) return false;
      for (int q = 0; q < world_; ++q) {
        if (q == rank_) continue;
        if (inPlace) {
          parts[q] = buffers_[rank_] + half + q * g_.roundBytes;
        } else {
          ex_.copy(out + int64_t(q) * slotBytes + off, buffers_[rank_] + half + q * g_.roundBytes,
                   len);
        }
      }
      ex_.flush();
    }
    if (inPlace) parts[rank_] = own;
    return true;
  }

  // Bytes this rank writes into peers' buffers in one run of slotBytes.
  int64_t peerBytes(int64_t slotBytes) const { return int64_t(world_ - 1) * slotBytes; }

  // Point-to-point legs: each sending leg's first `bytes` of `slot` go to rank `peer`, and each
  // receiving leg gets `bytes` from rank `peer`. At most one sending and one receiving leg per
  // peer (a round holds one part from each source), never this rank. The exchange takes
  // ceil(unitBytes / roundBytes) rounds, at least one: unitBytes must be the same on every rank
  // (the schedules' legs are all one unit of the plan, Call::unit(), whatever their messages),
  // and every rank takes part in each round, also with legs of no bytes. On return where[i] says
  // where leg i's bytes lie: in one round a receiving leg's stay where they landed (this rank's
  // half at [peer * roundBytes]; rewritten only after the barrier of the next exchange, as in
  // run()); in several they are copied into its slot, as run() copies into `out`. A sending
  // leg's lie in its slot.
  bool runLegs(const Leg* legs, int count, int64_t unitBytes, const uint8_t** where) {
    if (!begin()) return false;
    const int64_t rounds = std::max<int64_t>(1, (unitBytes + g_.roundBytes - 1) / g_.roundBytes);
    const bool inPlace = rounds == 1;
    for (int64_t n = 0; n < rounds; ++n, ++round_) {
      const int64_t off = n * g_.roundBytes;
      const int64_t half = kIpcDataOffset + (round_ & 1) * g_.halfBytes;
      for (int i = 0; i < count; ++i) {
        const Leg& l = legs[i];
        const int64_t len = std::min(g_.roundBytes, l.bytes - off);
        if (l.send && len > 0) {
          ex_.copy(buffers_[l.peer] + half + rank_ * g_.roundBytes, l.slot + off, len);
        }
      }
      if (!ex_.barrier(barriers_++)) return false;
      for (int i = 0; i < count; ++i) {
        const Leg& l = legs[i];
        const uint8_t* part = buffers_[rank_] + half + l.peer * g_.roundBytes;
        const int64_t len = std::min(g_.roundBytes, l.bytes - off);
        if (l.send) {
          where[i] = l.slot;
        } else if (inPlace) {
          where[i] = part;
        } else {
          if (len > 0) ex_.copy(l.slot + off, part, len);
          where[i] = l.slot;
        }
      }
      ex_.flush();
    }
    return true;
  }

 private:
  Exec& ex_;
  IpcExchangeGeometry g_;
  uint8_t* const* buffers_;
  int rank_, world_;
  uint32_t fingerprint_;
  int64_t round_ = 0;      // rounds of this call so far (the half: round_ % 2)
  uint32_t barriers_ = 0;  // barriers of this call so far (names them in errors)
};

}  // namespace ipc

// The Transport of an algorithm's exchanges over CopySchedule: all-to-all and all-gather
// (two_step's) and point-to-point legs (the rings'), stream-ordered, each exchange run once all its
// data to send is ready (one of legs that only receive: when posted). A legs exchange runs in as
// many rounds as its largest slot takes: the schedules' slots are all one unit of the plan
// (Call::unit()), the same on every rank, so every rank runs the same rounds. An executor that
// failed (a launch, or a barrier that gave up) raises, naming the step.
template <class Exec>
class IpcExchangeTransport final : public Transport {
 public:
  IpcExchangeTransport(Exec ex, const IpcExchangeGeometry& g, uint8_t* const* buffers, int rank,
                       int world, uint32_t fingerprint = 0)
      : Transport(rank, world),
        ex_(std::move(ex)),
        schedule_(ex_, g, buffers, rank, world, fingerprint) {}

  const Exec& executor() const { return ex_; }

  bool overlapsCodec() const override { return false; }
  int post(Exchange x) override {
    states_.push_back(State{std::move(x)});
    State& s = states_.back();
    if (s.x.kind == Exchange::kLegs) {
      s.sends = checkLegs(s.x);
      if (s.sends == 0) runLegs(s);
    } else {
      s.sends = s.x.kind == Exchange::kAllToAll ? world() : 1;
    }
    return int(states_.size()) - 1;
  }
  void ready(int id, int) override {
    State& s = states_.at(size_t(id));
    if (++s.readies < s.sends) return;
    if (s.x.kind == Exchange::kLegs) return runLegs(s);
    const bool gather = s.x.kind == Exchange::kAllGather;
    s.parts.assign(size_t(world()), nullptr);
    const int64_t slot = gather ? s.x.send.numel() : s.x.send.numel() / world();
    const bool ok = schedule_.run(static_cast<uint8_t*>(s.x.recv.data_ptr()),
                                  static_cast<const uint8_t*>(s.x.send.data_ptr()), slot, gather,
                                  s.parts.data());
    sent_ += schedule_.peerBytes(slot);
    check(ok, s.x.what);
  }
  const uint8_t* wait(int id, int i) override {
    const State& s = states_.at(size_t(id));
    if (s.parts.empty()) {
      throw std::logic_error(rankPrefix(rank(), world()) + "allreduce: " + s.x.what +
                             ": waited for before its data to send was ready");
    }
    return s.parts[size_t(i)];
  }
  void finish() override {}
  int64_t bytesSent() const override { return sent_; }

 private:
  struct State {
    Exchange x;
    int sends = 0;  // the slots or sending legs declared ready before it runs
    int readies = 0;
    std::vector<const uint8_t*> parts;  // where each slot or leg lies, once run
  };
  // The sending legs of a legs exchange, after checking what runLegs() needs of them: a peer in
  // the group other than this rank, at most one sending and one receiving leg per peer, and a
  // message that fits its slot.
  int checkLegs(const Exchange& x) const {
    std::vector<int> seen(size_t(world()), 0);  // bit 0: a sending leg to the peer, 1: receiving
    int sends = 0;
    for (const Exchange::Leg& l : x.legs) {
      const int bit = l.send ? 1 : 2;
      const bool ok = l.peer >= 0 && l.peer < world() && l.peer != rank() &&
                      (seen[size_t(l.peer)] & bit) == 0 && l.bytes >= 0 &&
                      l.bytes <= l.slot.numel();
      if (!ok) {
        throw std::invalid_argument(rankPrefix(rank(), world()) + "allreduce: " + x.what +
                                    ": CUDA IPC takes at most one sending and one receiving leg " +
                                    "per peer, never this rank, each within its slot (leg " +
                                    (l.send ? "to" : "from") + " rank " + std::to_string(l.peer) +
                                    ")");
      }
      seen[size_t(l.peer)] |= bit;
      sends += l.send ? 1 : 0;
    }
    return sends;
  }
  void runLegs(State& s) {
    std::vector<ipc::Leg> legs;
    int64_t unitBytes = 0;
    for (const Exchange::Leg& l : s.x.legs) {
      legs.push_back({l.send, l.peer, l.slot.data_ptr<uint8_t>(), l.bytes});
      unitBytes = std::max(unitBytes, l.slot.numel());
      if (l.send) sent_ += l.bytes;
    }
    s.parts.assign(legs.size(), nullptr);
    check(schedule_.runLegs(legs.data(), int(legs.size()), unitBytes, s.parts.data()), s.x.what);
  }
  void check(bool ok, const std::string& what) {
    const std::string why = ex_.failure();
    if (!ok || !why.empty()) {
      throw std::runtime_error("enqueuing " + what + " failed" +
                               (why.empty() ? ": a barrier gave up" : " (" + why + ")"));
    }
  }
  Exec ex_;
  ipc::CopySchedule<Exec> schedule_;
  std::vector<State> states_;
  int64_t sent_ = 0;
};

}  // namespace qcomm
