// Transport over an inner c10d backend: every call is a plain c10d collective on uint8 tensors.
#include "transport/c10d_transport.h"

#include <c10/util/Exception.h>

namespace qcomm {
namespace {
// Our point-to-point tags live above 2^30, away from the small tags user code passes to send/recv
// on the same group, so a user's outstanding irecv can never match our bytes.
constexpr int kTagBase = 1 << 30;
}  // namespace

std::string rankPrefix(int rank, int world) {
  return "[qcomm rank " + std::to_string(rank) + "/" + std::to_string(world) + "] ";
}

Transport::Transport(c10d::Backend* inner, int rank, int world, std::chrono::milliseconds timeout,
                     bool streamOrdered)
    : inner_(inner), rank_(rank), world_(world), timeout_(timeout), streamOrdered_(streamOrdered) {
  TORCH_CHECK(inner_ != nullptr, rankPrefix(rank, world), "no inner backend for this device");
}

void Transport::wait(const c10::intrusive_ptr<c10d::Work>& w, const std::string& what) {
  // One sentence for the user: the step, the cause without a C++ backtrace, and the bound that
  // applied. A peer that died shows up as a reset connection at once; one that stopped, as a
  // time-out after timeoutMs.
  if (!w) return;
  std::string cause;
  try {
    if (streamOrdered_) {
      w->wait();
    } else {
      w->wait(timeout_);
    }
    return;
  } catch (const c10::Error& e) {
    cause = e.what_without_backtrace();
  } catch (const std::exception& e) {
    cause = e.what();
  }
  TORCH_CHECK(false, rankPrefix(rank_, world_), "allreduce: ", what, " failed (timeout ",
              timeout_.count(), " ms; a peer may have died or stopped): ", cause);
}

void Transport::allToAll(at::Tensor& out, at::Tensor& in, const char* what) {
  std::vector<int64_t> none;
  bytesSent_ += in.numel() / world_ * (world_ - 1);
  wait(inner_->alltoall_base(out, in, none, none), what);
}

void Transport::allGather(at::Tensor& out, at::Tensor& in, const char* what) {
  bytesSent_ += in.numel() * (world_ - 1);
  wait(inner_->_allgather_base(out, in), what);
}

// Where each of the W slots of `out` lies.
static void slotsOf(at::Tensor& out, int world, const uint8_t** parts) {
  const int64_t slot = out.numel() / world;
  for (int i = 0; i < world; ++i) parts[i] = out.data_ptr<uint8_t>() + i * slot;
}

void Transport::allToAll(at::Tensor& out, at::Tensor& in, const char* what, const uint8_t** parts) {
  allToAll(out, in, what);
  slotsOf(out, world_, parts);
}

void Transport::allGather(at::Tensor& out, at::Tensor& in, const char* what,
                          const uint8_t** parts) {
  allGather(out, in, what);
  slotsOf(out, world_, parts);
}

void Transport::startBatch() {
  batching_ = inner_->supportsCoalescing();
  if (batching_) inner_->startCoalescing();
}

c10::intrusive_ptr<c10d::Work> Transport::endBatch() {
  if (!batching_) return {};
  batching_ = false;
  return inner_->endCoalescing();
}

c10::intrusive_ptr<c10d::Work> Transport::isend(at::Tensor& t, int peer, int tag) {
  std::vector<at::Tensor> v{t};
  bytesSent_ += t.numel();
  return inner_->send(v, peer, kTagBase + tag);
}

c10::intrusive_ptr<c10d::Work> Transport::irecv(at::Tensor& t, int peer, int tag) {
  std::vector<at::Tensor> v{t};
  return inner_->recv(v, peer, kTagBase + tag);
}

}  // namespace qcomm
