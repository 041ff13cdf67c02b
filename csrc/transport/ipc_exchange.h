// The transport of two_step over the CUDA-IPC buffers (QCOMM_IPC_KERNELS=separate): its
// all-to-all and all-gather of encoded bytes done as copies through the buffers instead of NCCL,
// with the codec kernels of the NCCL path around them. CopySchedule is the schedule of those
// copies, written once for two executors: the CUDA one (gpu::ExchangeKernels, csrc/cuda/
// ipc_kernels.h: a copy kernel per step, W copies each, and a one-thread barrier kernel, all
// enqueued on the call's stream) and a host one (csrc/python/ipc_emulation.h: memcpy and the same
// barrier on host memory, one thread per rank) that the CPU tests run against the reference;
// IpcExchangeTransport runs an algorithm's exchanges through it.
//
// A call starts with a barrier, before its first copy (begin(), or the first run()): every rank
// has finished reading the previous call's parts in its buffer (copies out, or the decodes that
// read them where they landed), so its peers may write into it. What the caller enqueues before
// the first exchange (its allocations, the reduce phase's encodes) comes before that barrier, so
// nothing a rank does on the host while a peer's barrier waits for it is part of the call. Then
// each exchange moves every rank's slots in rounds of at most roundBytes per slot
// (ipcExchangeGeometry), round r through half r % 2 of the data regions, counted over the call:
//   1. copy: this rank's part of its slot for rank j into rank j's current half, at
//      [this rank * roundBytes] (peers in rotated order rank + 1, rank + 2, ...), and its own part
//      straight into `out`;
//   2. barrier: every rank has written its parts into this rank's half;
//   3. copy out: the W - 1 peers' parts in this rank's half into `out` at
//      [source rank * slotBytes + offset].
// A slot that takes one round (with the default 32 MiB buffer, messages of up to about 15.7
// million elements at 8 bits, whatever W) is not copied out at all: the caller reads the parts
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

// Each executor `ex` provides copy(dst, src, bytes) (it may hold copies back until the next
// flush() or barrier), flush(), barrier(index) (after the copies before it; false: it gave up,
// the error is recorded), and failure(): why a launch failed, "" when none did.
template <class Exec>
class CopySchedule {
 public:
  CopySchedule(Exec& ex, const IpcExchangeGeometry& g, uint8_t* const* buffers, int rank, int world)
      : ex_(ex), g_(g), buffers_(buffers), rank_(rank), world_(world) {}

  // The call's first barrier (once; the first run() enters it if begin() was not called).
  bool begin() {
    if (barriers_ > 0) return true;
    return ex_.barrier(barriers_++);
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

 private:
  Exec& ex_;
  IpcExchangeGeometry g_;
  uint8_t* const* buffers_;
  int rank_, world_;
  int64_t round_ = 0;      // rounds of this call so far (the half: round_ % 2)
  uint32_t barriers_ = 0;  // barriers of this call so far (names them in errors)
};

}  // namespace ipc

// The Transport of an algorithm's exchanges over CopySchedule: all-to-all and all-gather only
// (two_step's), stream-ordered, each exchange run once all its data to send is ready. An executor
// that failed (a launch, or a barrier that gave up) raises, naming the step.
template <class Exec>
class IpcExchangeTransport final : public Transport {
 public:
  IpcExchangeTransport(Exec ex, const IpcExchangeGeometry& g, uint8_t* const* buffers, int rank,
                       int world)
      : Transport(rank, world), ex_(std::move(ex)), schedule_(ex_, g, buffers, rank, world) {}

  const Exec& executor() const { return ex_; }

  bool overlapsCodec() const override { return false; }
  int post(Exchange x) override {
    if (x.kind == Exchange::kLegs) {
      throw std::invalid_argument(rankPrefix(rank(), world()) + "allreduce: " + x.what +
                                  ": CUDA IPC runs two_step only");
    }
    states_.push_back(State{std::move(x)});
    return int(states_.size()) - 1;
  }
  void ready(int id, int) override {
    State& s = states_.at(size_t(id));
    if (++s.readies < (s.x.kind == Exchange::kAllToAll ? world() : 1)) return;
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
    int readies = 0;
    std::vector<const uint8_t*> parts;  // where each slot lies, once run
  };
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
