// Test hook: a c10d::Backend that forwards every call to an inner backend and records what this
// rank puts on the wire (each send's peer, tag, length and a digest of its bytes; the header
// exchange's bytes; the sizes of collectives whose padding is not part of the message), so that a
// test can compare the wire bytes of a fixed set of allreduces before and after a change.
#pragma once

#include <pybind11/stl.h>
#include <torch/extension.h>

#include <mutex>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <tuple>
#include <vector>

namespace qcomm {
namespace {

// FNV-1a over the tensor's bytes (a CPU byte tensor, contiguous).
uint64_t digest(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  const int64_t n = c.numel() * c.element_size();
  uint64_t h = 1469598103934665603ull;
  for (int64_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

class RecordingBackend : public c10d::Backend {
 public:
  using Record = std::tuple<std::string, int, int, int64_t, uint64_t>;  // kind, peer, tag, n, hash

  explicit RecordingBackend(c10::intrusive_ptr<c10d::Backend> inner)
      : c10d::Backend(inner->getRank(), inner->getSize()), inner_(std::move(inner)) {}

  const std::string getBackendName() const override { return "recording"; }

  std::vector<Record> log() {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    log_.clear();
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override {
    add("send", dstRank, tag, tensors[0].numel(), digest(tensors[0]));
    return inner_->send(tensors, dstRank, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override {
    add("recv", srcRank, tag, tensors[0].numel(), 0);
    return inner_->recv(tensors, srcRank, tag);
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    // the plan header (fully determined) is hashed; gathered units carry padding: size only
    add("allgather", -1, 0, input.numel(), input.numel() <= 256 ? digest(input) : 0);
    return inner_->_allgather_base(output, input, opts);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override {
    add("alltoall", -1, 0, input.numel(), 0);
    return inner_->alltoall_base(output, input, outputSplits, inputSplits, opts);
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    add("allreduce", -1, 0, tensors[0].numel(), 0);
    return inner_->allreduce(tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    return inner_->broadcast(tensors, opts);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return inner_->barrier(opts);
  }
  void setSequenceNumberForGroup() override { inner_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }
  void shutdown() override { inner_->shutdown(); }
  void abort() override { inner_->abort(); }

 private:
  void add(const char* kind, int peer, int tag, int64_t n, uint64_t h) {
    std::lock_guard<std::mutex> lock(mu_);
    log_.emplace_back(kind, peer, tag, n, h);
  }
  c10::intrusive_ptr<c10d::Backend> inner_;
  std::mutex mu_;
  std::vector<Record> log_;
};

}  // namespace qcomm
