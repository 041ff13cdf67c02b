// QncclBackend: the c10d::Backend registered as "qnccl". It routes: an allreduce, reduce-scatter
// or all-gather becomes a Call (call.h), which quantizes where the group's config and the call's
// facts allow and passes through otherwise; every other collective passes through, unchanged, to
// the inner Gloo (CPU) or NCCL (CUDA) backend. It owns the group's state (group.h), its tuner
// (tuner.h) and its CUDA side (cuda_side.h), and their lifecycle.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "backend/call.h"
#include "backend/cuda_side.h"
#include "backend/group.h"
#include "backend/tuner.h"
#include "plan/config.h"
#include "plan/plan.h"

namespace qcomm {

class QncclBackend : public c10d::Backend {
 public:
  // disabled (QCOMM_DISABLE=1 at the group's creation): every collective passes through, whatever
  // config is set. cpuThreads: the threads the codec of a quantized CPU allreduce uses (0: torch's
  // intra-op thread count); the results do not depend on it. checkCalls: whether eager CUDA calls
  // exchange their header on the host first (QCOMM_DEBUG=CHECK or TORCH_DISTRIBUTED_DEBUG=DETAIL
  // on any rank: qcomm._create agrees on it, since ranks that differ would wait in different
  // places); -1: this process's settings.
  QncclBackend(int rank, int size, std::chrono::milliseconds timeout,
               c10::intrusive_ptr<c10d::Backend> gloo, c10::intrusive_ptr<c10d::Backend> nccl,
               const QuantConfig& config, c10::intrusive_ptr<c10d::Store> store = {},
               bool disabled = false, int cpuThreads = 0, int checkCalls = -1);
  ~QncclBackend() override;

  // QncclBackend objects alive in this process (a test reads it: destroy_process_group must
  // destroy a group's backend, and its inner Gloo and NCCL backends, before it returns).
  static int64_t liveCount();

  const std::string getBackendName() const override { return "qnccl"; }

  // configuration (Python: qcomm.set_config / get_config); a config with another tuning key
  // empties the tuning table
  void setConfig(const QuantConfig& config);
  QuantConfig getConfig() const { return group_.config(); }
  // qcomm.set_config's agreement: behind the calls issued on this group before it (it waits for
  // them to run), every rank publishes `mine` (its new config, as text) through the group's store
  // and reads the others'; returns every rank's, by rank. A rank that does not take part within
  // the group's timeout: a RuntimeError naming it (set_config is collective).
  std::vector<std::string> exchangeConfig(const std::string& mine) {
    return group_.exchangeConfig(mine);
  }
  // The group's state (stats, buffers, shadow statistics), tuner and CUDA side, for qcomm's
  // reports (python/module.cpp).
  Group& group() { return group_; }
  const Group& group() const { return group_; }
  Tuner& tuner() { return tuner_; }
  const Tuner& tuner() const { return tuner_; }
  CudaInfo cudaInfo() const { return cuda_.info(); }
  // The plan a call of `collective` would take now, as the tuning table says (qcomm.plan's
  // diagnostics): `message` the allreduce's tensor, the reduce-scatter's input or the
  // all-gather's output; `shard` the reduce-scatter's output or the all-gather's input.
  // alike: false for a coalesced call whose tensors cannot share one message.
  Plan plan(int32_t collective, const at::Tensor& message, const at::Tensor& shard,
            c10d::ReduceOp op, bool alike = true) const;
  // Measures now (collective: every rank calls it with the same host tensor shape and dtype)
  // which of exact and the quantized candidates is fastest for calls of `collective` of this
  // message's dtype and size class (a reduce-scatter's input, an all-gather's output: numel a
  // multiple of the world), and enters the choice in the table, replacing any earlier one.
  void tune(const at::Tensor& sample, int32_t collective = kAllreduce);
  c10::intrusive_ptr<c10d::Backend> inner(bool cuda) const {
    return cuda ? group_.nccl : group_.gloo;
  }

  // the collectives a Call takes (quantized where the config opts in, else passed through)
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;

  // pass-through collectives, dispatched on the tensors' device
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

  bool supportsCoalescing() const override { return group_.nccl != nullptr; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  void shutdown() override;
  void abort() override;

 private:
  // The test hooks (csrc/testing/testing.cpp) reach the state they set through this one friend:
  // the class has no methods for tests.
  friend struct BackendTestAccess;
  // A Call built by an entry point: held by this backend while queued, then issued.
  c10::intrusive_ptr<c10d::Work> issue(Call call);
  // A Call's facts as an entry point gives them (what the ranks' plans are made of).
  // The Call of a coalesced reduce-scatter or all-gather (backend.cpp says how its tensors are
  // packed); its `inner` is the caller's to set.
  Call shardedCoalesced(int32_t collective, const char* name,
                        const std::vector<at::Tensor>& outputs,
                        const std::vector<at::Tensor>& inputs, c10d::ReduceOp op,
                        std::chrono::milliseconds timeout, bool asyncOp) const;
  Call callOf(int32_t collective, const char* name, c10d::OpType type, const at::Tensor& message,
              const at::Tensor& shard, c10d::ReduceOp op, std::chrono::milliseconds timeout,
              bool asyncOp) const;

  Group group_;
  Tuner tuner_{group_};
  CudaSide cuda_{group_};
};

}  // namespace qcomm
