// The transport over an inner c10d backend (Gloo for CPU bytes, NCCL for CUDA bytes): every
// transfer is a c10d call on a uint8 tensor. Two ways to run an exchange:
//   kPointToPoint: each message its own send or receive of exactly its bytes; the receives are
//     posted when the exchange is declared and each send leaves as soon as its data is ready, so
//     on host memory the transfers progress while the codec runs (the CPU path over Gloo);
//   kCollectives: each exchange one collective over whole, equal slots, launched once all its
//     sends are ready (all-to-all: alltoall_base; all-gather: _allgather_base; legs: one
//     coalesced batch of sends and receives, as batch_isend_irecv, so a ring hop cannot deadlock);
//     what CUDA tensors take over NCCL, where a transfer waits for the stream's earlier kernels
//     anyway.
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

#include "transport/transport.h"

namespace qcomm {

class C10dTransport final : public Transport {
 public:
  enum Mode { kPointToPoint, kCollectives };

  // streamOrdered: the bytes live on a CUDA device and the inner backend is NCCL, whose
  // Work::wait() makes the current stream wait for the transfer without blocking the host; a wait
  // with a timeout would block the host, so waits pass none (NCCL's watchdog applies the group's
  // timeout instead). Otherwise every wait is bounded by `timeout`.
  C10dTransport(c10d::Backend* inner, int rank, int world, std::chrono::milliseconds timeout,
                Mode mode, bool streamOrdered = false);

  bool overlapsCodec() const override { return mode_ == kPointToPoint; }
  int post(Exchange x) override;
  void ready(int id, int i) override;
  const uint8_t* wait(int id, int i) override;
  void finish() override;
  int64_t bytesSent() const override { return bytesSent_; }

  // Every rank receives every rank's `in` into slot i of `out`, now (the plan header's exchange).
  void allGatherNow(at::Tensor& out, at::Tensor& in, const std::string& what);
  // The collective its errors name ("allreduce" unless set; a string that outlives the transport).
  void setCall(const char* call) { call_ = call; }

 private:
  struct State {
    Exchange x;
    std::vector<c10::intrusive_ptr<c10d::Work>> recvs;  // kPointToPoint: per slot or leg
    std::vector<c10::intrusive_ptr<c10d::Work>> works;  // kCollectives: the launch's
    int readies = 0;
    bool launched = false;
    bool done = false;
  };
  int sendsOf(const Exchange& x) const;  // how many ready() calls an exchange takes
  void launch(State& s);                 // kCollectives
  void waitAll(State& s);                // kCollectives: every work of the launch
  void sendLeg(State& s, int i);         // kPointToPoint
  c10::intrusive_ptr<c10d::Work> isend(const at::Tensor& t, int peer, int tag);
  c10::intrusive_ptr<c10d::Work> irecv(const at::Tensor& t, int peer, int tag);
  // Waits for `w`, bounded by the timeout unless stream-ordered; `what` names the step.
  void await(const c10::intrusive_ptr<c10d::Work>& w, const std::string& what);

  c10d::Backend* inner_;
  std::chrono::milliseconds timeout_;
  Mode mode_;
  bool streamOrdered_;
  std::vector<State> exchanges_;
  std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, std::string>> sends_;  // in flight
  int64_t bytesSent_ = 0;
  const char* call_ = "allreduce";
};

}  // namespace qcomm
