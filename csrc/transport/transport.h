// The byte transport: the one interface through which an algorithm (csrc/algo/) moves encoded
// bytes between the ranks of a group. An algorithm declares each step's transfers as an Exchange,
// says when each piece of data to send is ready, and waits for each piece it receives; the
// transport decides how the bytes move. Implementations:
//   C10dTransport (c10d_transport.h): over an inner c10d backend, either point to point (Gloo on
//     host memory: receives posted when declared, each send leaving as soon as it is ready, so the
//     transfers overlap the codec) or as one collective per exchange (NCCL, stream-ordered);
//   IpcExchangeTransport (ipc_exchange.h): copies through the CUDA-IPC buffers between barriers.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace qcomm {

// The transfers of one step of an algorithm, for this rank.
struct Exchange {
  enum Kind {
    kAllToAll,   // slot j of `send` goes to rank j; slot i of `recv` comes from rank i
    kAllGather,  // `send` (one slot) goes to every rank; slot j of `recv` comes from rank j
    kLegs,       // the point-to-point legs below
  };
  // One point-to-point transfer: `slot` is the whole unit (what a collective moves), of which the
  // first `bytes` are the message (what point-to-point moves).
  struct Leg {
    bool send;
    int peer;
    int tag;
    at::Tensor slot;
    int64_t bytes;
  };

  Kind kind = kLegs;
  std::string what;  // names the step in errors
  int tag = 0;       // kAllToAll, kAllGather: the point-to-point tag of every transfer
  // kAllToAll, kAllGather: W slots of `stride` bytes in `recv` (and in `send` for kAllToAll; one
  // slot for kAllGather). bytes[j] is the length of the message of chunk j: what this rank sends
  // to rank j (all-to-all) or receives from rank j (all-gather); every slot it receives in an
  // all-to-all, and what it sends in an all-gather, is bytes[rank] long.
  at::Tensor send, recv;
  int64_t stride = 0;
  std::vector<int64_t> bytes;
  std::vector<Leg> legs;  // kLegs

  static Exchange slots(Kind kind, std::string what, int tag, at::Tensor send, at::Tensor recv,
                        int64_t stride, std::vector<int64_t> bytes) {
    Exchange x;
    x.kind = kind;
    x.what = std::move(what);
    x.tag = tag;
    x.send = std::move(send);
    x.recv = std::move(recv);
    x.stride = stride;
    x.bytes = std::move(bytes);
    return x;
  }
  static Exchange ofLegs(std::string what, std::vector<Leg> legs) {
    Exchange x;
    x.what = std::move(what);
    x.legs = std::move(legs);
    return x;
  }
};

class Transport {
 public:
  virtual ~Transport() = default;
  int rank() const { return rank_; }
  int world() const { return world_; }

  // True when transfers progress on their own while this rank runs the codec (host memory over
  // Gloo): the algorithms then cut each chunk into the plan's microshards and declare every
  // exchange before they compute, so that every receive is posted early. False for transports
  // whose transfers are ordered on a CUDA stream after the codec kernels enqueued before them
  // (NCCL, CUDA IPC): chunks then move whole, one collective per exchange, and an exchange's
  // buffers may be reused as soon as a wait on it has returned.
  virtual bool overlapsCodec() const = 0;

  // Declares an exchange (a transport that can posts its receives now) and returns its id. The
  // buffers must stay valid until finish() returns.
  virtual int post(Exchange x) = 0;
  // The data of slot or leg `i` of exchange `id` is in place: it may leave (all-to-all: slot i,
  // every i including this rank's own; all-gather: i = this rank; legs: a sending leg).
  // Every slot and sending leg of an exchange is declared ready, also those of no bytes.
  virtual void ready(int id, int i) = 0;
  // Waits until received slot or leg `i` of exchange `id` is here (slot i: from rank i; i = this
  // rank: its own slot) and returns where its bytes lie (they stay there until the exchange's
  // buffers are written again). Every sending slot of the exchange was declared ready first.
  virtual const uint8_t* wait(int id, int i) = 0;
  // Waits for everything still in flight (this rank's sends, exchanges never waited for).
  virtual void finish() = 0;

  // Bytes this rank has put on the wire through this transport.
  virtual int64_t bytesSent() const = 0;

 protected:
  Transport(int rank, int world) : rank_(rank), world_(world) {}

 private:
  int rank_;
  int world_;
};

}  // namespace qcomm
