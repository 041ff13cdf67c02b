// Transport: moves opaque byte tensors between the ranks of a group through an inner c10d backend
// (Gloo for CPU bytes, NCCL for CUDA bytes). Algorithms speak only to this interface.
#pragma once

#include <chrono>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

namespace qcomm {

// The two collectives of byte tensors that two_step and the gather phase need: Transport's (the
// inner backend's), or the CUDA-IPC buffers' (cuda_ipc.cpp, QCOMM_IPC_KERNELS=separate).
class ByteExchange {
 public:
  virtual ~ByteExchange() = default;
  // Rank j receives slot j of every rank's `in` (W equal slots) as its slot i from rank i; on
  // return parts[i] (W pointers) says where slot i lies: slot i of `out`, or where the exchange
  // left it (valid until its next exchange, whose first copy is stream-ordered after what the
  // caller enqueues before it). `what` names the step in errors.
  virtual void allToAll(at::Tensor& out, at::Tensor& in, const char* what,
                        const uint8_t** parts) = 0;
  // Every rank receives every rank's `in` as its slot i; parts as above (`out`: W slots).
  virtual void allGather(at::Tensor& out, at::Tensor& in, const char* what,
                         const uint8_t** parts) = 0;
};

class Transport final : public ByteExchange {
 public:
  // streamOrdered: the bytes live on a CUDA device and the inner backend is NCCL, whose
  // Work::wait() makes the current stream wait for the transfer without blocking the host; a
  // wait with a timeout would block the host, so waits pass none (NCCL's watchdog applies the
  // group's timeout instead).
  Transport(c10d::Backend* inner, int rank, int world, std::chrono::milliseconds timeout,
            bool streamOrdered = false);

  int rank() const { return rank_; }
  int world() const { return world_; }

  // Rank j receives slot j of every rank's `in` (W equal slots) into slot i of `out` for rank i.
  void allToAll(at::Tensor& out, at::Tensor& in, const char* what);
  // Every rank receives every rank's `in` into slot i of `out`.
  void allGather(at::Tensor& out, at::Tensor& in, const char* what);
  // The same, every slot in `out` (ByteExchange).
  void allToAll(at::Tensor& out, at::Tensor& in, const char* what, const uint8_t** parts) override;
  void allGather(at::Tensor& out, at::Tensor& in, const char* what, const uint8_t** parts) override;
  // Point-to-point; tags are offset into a range user code does not use.
  c10::intrusive_ptr<c10d::Work> isend(at::Tensor& t, int peer, int tag);
  c10::intrusive_ptr<c10d::Work> irecv(at::Tensor& t, int peer, int tag);
  // Wait for `w`, bounded by the group's timeout; `what` names the step in the error. A null
  // Work (a send or receive issued inside a batch of a coalescing backend) is nothing to wait for.
  void wait(const c10::intrusive_ptr<c10d::Work>& w, const std::string& what);
  // Group the isend/irecv calls between these two into one launch where the inner backend
  // coalesces (NCCL; as batch_isend_irecv does, so a hop's send and receive cannot deadlock);
  // a no-op pair otherwise (Gloo). endBatch returns the batch's Work, or null.
  void startBatch();
  c10::intrusive_ptr<c10d::Work> endBatch();

  int64_t bytesSent() const { return bytesSent_; }

 private:
  c10d::Backend* inner_;
  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  bool streamOrdered_;
  bool batching_ = false;
  int64_t bytesSent_ = 0;
};

// The prefix every error of this rank carries: "[qcomm rank r/N] ".
std::string rankPrefix(int rank, int world);

}  // namespace qcomm
