// QncclBackend: the c10d::Backend registered as "qnccl". An eligible allreduce runs a quantized
// plan; every other call passes through, unchanged, to the inner Gloo (CPU) or NCCL (CUDA) backend.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "algo/scratch.h"
#include "backend/progress.h"
#include "plan/config.h"
#include "plan/plan.h"
#include "transport/c10d_transport.h"

namespace qcomm {

struct Stats {
  std::atomic<int64_t> quantizedCalls{0};
  std::atomic<int64_t> passthroughCalls{0};
  std::atomic<int64_t> inputBytes{0};    // bytes of the tensors given to quantized allreduces
  std::atomic<int64_t> wireBytes{0};     // bytes this rank sent for quantized allreduces
  std::atomic<int64_t> tunedClasses{0};  // size classes this rank measured (plan/tuning.h)
  std::atomic<int64_t> tuneNanos{0};     // time those measurements took
};

// The CUDA side of a group (backend_cuda.cpp): the device, the transport chosen at the first
// quantized CUDA allreduce, and the side stream of async ops.
struct CudaPath;
struct CudaPathDeleter {
  void operator()(CudaPath* p) const;
};

// Shadow mode (QuantConfig.shadow): the error of the shadowed calls of one dtype and size class,
// against the exact allreduce of the same input (over the elements whose exact sum is finite).
struct ShadowStat {
  int64_t calls = 0;
  double relL2Sum = 0;  // sum over calls of |q - exact|_2 / |exact|_2
  double relL2Max = 0;
  double maxAbs = 0;   // the largest |q - exact| of any element of any call
  double seconds = 0;  // the time the exact allreduces and comparisons took
};

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

  // configuration and statistics (Python: qcomm.set_config / get_config / stats)
  void setConfig(const QuantConfig& config);
  QuantConfig getConfig() const;
  const Stats& stats() const { return stats_; }
  bool checkCalls() const { return checkCalls_; }
  // The kept buffers of this group's host-memory allreduces (algo/scratch.h): bytes held, and
  // freeing them (after the call running now, if any; the next call allocates afresh).
  int64_t scratchBytes() const;
  // The threads the codec of the last quantized CPU allreduce could use (0 before the first).
  int cpuThreadsUsed() const { return cpuThreadsUsed_.load(); }
  int64_t releaseScratch();
  void resetStats();
  // Shadow mode's statistics, keyed "<dtype> <size class>" (e.g. "float32 4 MiB to 8 MiB").
  std::map<std::string, ShadowStat> shadowStats() const;
  // The sequence number the next quantized allreduce will carry (it seeds stochastic rounding).
  uint32_t nextCallSeq() const { return callSeq_; }
  // The plan an allreduce of this tensor would take now (for tests and diagnostics).
  Plan planFor(const at::Tensor& t, c10d::ReduceOp op) const;

  // The tuner (tuner.cpp, plan/tuning.h). The table every rank of the group holds alike, of
  // host-memory allreduces (cuda false; the one the cache holds) or of CUDA tensors.
  std::vector<TuneEntry> tuningEntries(bool cuda = false) const;
  // Entries every rank loads alike (qcomm's cache, read by rank 0 and shared through the store).
  void loadTuning(const std::vector<TuneEntry>& entries);
  // Rank 0 writes the table to `path` (JSON, under `keyJson`) after each measurement; "" never.
  void setTuningCache(const std::string& path, const std::string& keyJson);
  std::string tuningCachePath() const;
  // Measures now (collective: every rank calls it with the same tensor shape and dtype) which of
  // exact and the quantized candidates is fastest for allreduces of this tensor's dtype and size
  // class, and enters the choice in the table of its device, replacing any earlier one.
  void tune(const at::Tensor& sample);
  // A test hook: this rank's measured time of candidate i is multiplied by factors[i].
  void setTuneTimingFactors(std::vector<double> factors);
  c10::intrusive_ptr<c10d::Backend> inner(bool cuda) const { return cuda ? nccl_ : gloo_; }
  // The transport quantized CUDA allreduces use ("ipc" or "nccl"), "" before the first one, and
  // why CUDA IPC was not chosen (empty when it was).
  std::string cudaTransport() const;
  std::string cudaTransportNote() const;
  // With the IPC transport, how it runs two_step (QCOMM_IPC_KERNELS): "fused" or "separate";
  // "" otherwise.
  std::string cudaIpcKernels() const;
  // QCOMM_IPC_PROFILE=1 at the group's CUDA-IPC set-up: (phase, cycles summed over the fused
  // kernel's blocks) since then, and ("runs", block-pieces run); empty otherwise.
  std::vector<std::pair<std::string, int64_t>> cudaIpcProfile() const;

  // the quantized collective
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;

  // pass-through collectives, dispatched on the tensors' device
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
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
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
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

  bool supportsCoalescing() const override { return nccl_ != nullptr; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  void shutdown() override;
  void abort() override;

 private:
  c10d::Backend* pick(const at::Tensor& t, const char* op) const;
  // Refuses tensors whose elements overlap in memory (expanded views), which Gloo would crash on,
  // before anything is sent: a ValueError naming the rank and the op.
  void refuseOverlap(const std::vector<at::Tensor>& ts, const char* op) const;
  void refuseOverlap(const std::vector<std::vector<at::Tensor>>& ts, const char* op) const;
  // Counts a pass-through call and picks the inner backend for the first tensor.
  c10d::Backend* pickAll(const std::vector<at::Tensor>& ts, const char* op) const;
  std::string prefix() const;
  using Issued = c10::intrusive_ptr<c10d::Work>;
  // A pass-through call. CUDA tensors, and host tensors while nothing of this group is queued, go
  // to the inner backend at once; host tensors behind queued work wait in the queue, so the inner
  // Gloo sees this rank's calls in the order they were issued (its collectives match by order).
  // `outputs`: what the queued Work's result() and future give.
  c10::intrusive_ptr<c10d::Work> forward(c10d::Backend* inner, const char* op, c10d::OpType type,
                                         std::vector<at::Tensor> outputs,
                                         std::function<Issued(c10d::Backend*)> issue);
  // Raises once a quantized allreduce of this group failed in its transport.
  void checkUsable(const char* op) const;
  void breakWith(const std::string& why);
  c10::intrusive_ptr<c10d::Work> passThroughAllreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts);
  // On the progress thread: one quantized allreduce of host memory. A transport failure breaks
  // the group (checkUsable); a disagreement of the ranks raises on every rank and does not.
  void runQueued(const Plan& plan, at::Tensor& tensor, std::chrono::milliseconds timeout);
  // Returns the ranks' disagreement on the call's header ("" when they agree and it ran).
  // count: false for the tuner's runs (not in stats()).
  std::string runQuantizedCpu(const Plan& plan, at::Tensor& tensor,
                              std::chrono::milliseconds timeout, bool count = true);
  // Shadow mode: records the error of `result` against `exact` (plan.shadowed() calls).
  void recordShadow(const Plan& plan, const at::Tensor& result, const at::Tensor& exact,
                    double exactSeconds);
  c10::intrusive_ptr<c10d::Work> allreduceCuda(Plan plan, std::vector<at::Tensor>& tensors,
                                               const c10d::AllreduceOptions& opts);
  // allreduceCuda's launches, once the call is agreed: `buf` is t itself or its contiguous or
  // padded copy.
  c10::intrusive_ptr<c10d::Work> launchCuda(const Plan& plan, std::vector<at::Tensor>& tensors,
                                            at::Tensor& buf, bool padded, CudaPath& path,
                                            bool useIpc, const c10d::AllreduceOptions& opts,
                                            std::function<void()> check);
  // The CUDA path of this group, set up (collectively, through the store) on first use.
  CudaPath& cudaPath(int device, bool capturing);
  std::chrono::milliseconds callTimeout(const c10d::AllreduceOptions& opts) const;
  // QCOMM_DEBUG=INFO, rank 0: the first allreduce of each size class and decision says what it
  // does; after kQuietCalls eligible allreduces that all passed through, once, that none was
  // quantized (and the last reason).
  void logDecision(const Plan& plan, const at::Tensor& t, c10d::ReduceOp op);
  // Exchange the plan's header; returns the difference, if ranks disagree ("" if they agree).
  std::string agreeOnPlan(const Plan& plan, C10dTransport& t);
  // agreeOnPlan over Gloo, run on the progress thread behind the host-memory calls queued there
  // (the caller waits): a call from another thread (the CUDA path's) keeps Gloo's order of
  // collectives the same on every rank.
  std::string agreeOnQueue(const Plan& plan, std::chrono::milliseconds timeout);
  // Raises the disagreement agreeOnPlan found, on every rank alike.
  void requireAgreement(const std::string& mismatch) const;
  // On the progress thread: the codec's thread count for this group (cpuThreads).
  void useCodecThreads();
  // Runs `body` on the progress thread; a transport failure in it breaks the group (checkUsable).
  void guardTransport(const std::function<void()>& body);
  // Measures the class of `plan` (a plan with tuneNeeded, or the placeholder tune() made) on
  // copies of `sample`, unless `onlyIfMissing` and it is in the table: host memory on the
  // progress thread, CUDA tensors on the caller's thread and current stream.
  void measureClass(const Plan& plan, const at::Tensor& sample, std::chrono::milliseconds timeout,
                    bool onlyIfMissing);
  // The exact inner allreduce of a CPU tensor, on the progress thread (a class tuned to exact).
  void exactOnQueue(at::Tensor& t, const c10d::AllreduceOptions& opts);
  void saveTuning() const;
  // One timed run of the tuner on a CUDA tensor (backend_cuda.cpp): the exact NCCL allreduce
  // (candidate null) or the candidate's quantized one, then the current stream synchronized.
  void cudaTuneRun(const Plan* candidate, at::Tensor& work, const c10d::AllreduceOptions& opts);
  // The tensor's current stream is capturing a CUDA graph; waiting for that stream.
  bool cudaCapturing(const at::Tensor& t) const;
  void cudaSync(const at::Tensor& t) const;
  CallFacts factsOf(const at::Tensor& t, c10d::ReduceOp op) const;

  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Backend> gloo_;
  c10::intrusive_ptr<c10d::Backend> nccl_;
  c10::intrusive_ptr<c10d::Store> store_;
  mutable std::mutex cudaMutex_;
  std::unique_ptr<CudaPath, CudaPathDeleter> cuda_;
  std::string cudaSetupError_;  // the set-up failed: every later CUDA allreduce raises this
  mutable std::mutex configMutex_;
  QuantConfig config_;
  Stats stats_;
  std::atomic<bool> shutDown_{false};
  mutable std::mutex shadowMutex_;
  std::map<std::string, ShadowStat> shadow_;
  std::mutex logMutex_;
  std::set<std::string> logged_;  // the decisions logged (size class, dtype, decision)
  int64_t eligibleCalls_ = 0;     // allreduces of fp32/fp16/bf16 dense tensors, SUM or AVG
  bool quietLogged_ = false;
  const bool disabled_;
  // QCOMM_DEBUG=CHECK or TORCH_DISTRIBUTED_DEBUG=DETAIL: every eager quantized CUDA call exchanges
  // its plan header on the host first, also where the CUDA-IPC barrier compares fingerprints
  const bool checkCalls_;
  const int cpuThreads_;
  std::atomic<int> cpuThreadsUsed_{0};
  std::atomic<uint32_t> callSeq_{0};  // quantized allreduces issued here (seeds the rounding noise)
  mutable std::mutex scratchMutex_;   // held by the call that uses scratch_
  Scratch scratch_;
  mutable std::mutex tuningMutex_;  // guards the four below
  TuningTable tuning_, tuningCuda_;
  std::string tuneFile_, tuneKey_;
  std::vector<double> tuneTimingFactors_;
  mutable std::mutex brokenMutex_;
  std::string broken_;  // the first transport failure of a quantized allreduce
  // last, so that it stops (and joins its thread) before the members its tasks use go
  ProgressQueue queue_;
};

}  // namespace qcomm
