// QncclBackend: the c10d::Backend registered as "qnccl". An eligible allreduce, and an eligible
// reduce-scatter or all-gather where the group's config opts in (sharded.cpp), runs a quantized
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
#include <tuple>
#include <utility>
#include <vector>

#include "algo/scratch.h"
#include "backend/progress.h"
#include "backend/staging.h"
#include "plan/config.h"
#include "plan/plan.h"
#include "transport/c10d_transport.h"

namespace qcomm {

struct CodecOps;  // codec/codec_ops.h

// One collective's counters (stats()["by_collective"]).
struct CollectiveStats {
  std::atomic<int64_t> quantizedCalls{0};
  std::atomic<int64_t> passthroughCalls{0};
  std::atomic<int64_t> inputBytes{0};
  std::atomic<int64_t> wireBytes{0};
};

struct Stats {
  std::atomic<int64_t> quantizedCalls{0};
  std::atomic<int64_t> passthroughCalls{0};
  std::atomic<int64_t> inputBytes{0};      // bytes of the tensors given to quantized allreduces
  std::atomic<int64_t> wireBytes{0};       // bytes this rank sent for quantized allreduces
  std::atomic<int64_t> tunedClasses{0};    // size classes this rank measured (plan/tuning.h)
  std::atomic<int64_t> tuneNanos{0};       // time those measurements took
  std::atomic<int64_t> checkedClasses{0};  // cached entries confirmed by the check at first use
  std::atomic<int64_t> checkNanos{0};      // time those checks took (re-tunes not included)
  std::atomic<int64_t> retunedClasses{0};  // classes measured again: check or drift disagreed
  // reduce-scatters and all-gathers (sharded.cpp; also counted in the totals above), indexed by
  // Collective: the allreduce's entry is the totals less these
  CollectiveStats sharded[3];
};

// A reduce-scatter or all-gather as the sharded path (sharded.cpp) takes it.
struct ShardedCall {
  int32_t collective = kReduceScatter;  // or kAllGather
  const char* name = "";                // "reduce_scatter_tensor", "all_gather_into_tensor", ...
  c10d::OpType type = c10d::OpType::UNKNOWN;
  at::Tensor message;  // reduce-scatter: the input (W shards); all-gather: the output
  at::Tensor shard;    // reduce-scatter: the output; all-gather: the input
  c10d::ReduceOp op;   // SUM for an all-gather
  std::chrono::milliseconds timeout{0};
  bool asyncOp = true;
  bool shapeOk = true;              // the list forms check their shapes themselves
  std::vector<at::Tensor> outputs;  // what the Work gives
  // the inner backend's own call (pass-through)
  std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend*)> inner;
  // list forms: builds `message` (packing the inputs) once the call is to be quantized
  std::function<void(ShardedCall&)> pack;
  // list forms: after the quantized run, copies the message into the caller's tensors
  std::function<void(ShardedCall&)> unpack;
  // the group's config when the call was issued: a queued call is planned with it, not with a
  // config set since
  QuantConfig config;
};

// The buffers a quantized reduce-scatter or all-gather runs on (QncclBackend::stageSharded).
struct ShardedStage {
  Staged message;  // the reduce-scatter's input (never written), the all-gather's output
  Staged shard;    // the reduce-scatter's output
};

// The CUDA side of a group (backend_cuda.cpp): the device, the transport chosen at the first
// quantized CUDA allreduce, and the side stream of async ops.
struct CudaPath;
class QueuedWork;  // backend/work.h
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
  // qcomm.set_config's agreement: behind the calls issued on this group before it (it waits for
  // them to run), every rank publishes `mine` (its new config, as text) through the group's store
  // and reads the others'; returns every rank's, by rank. A rank that does not take part within
  // the group's timeout: a RuntimeError naming it (set_config is collective).
  std::vector<std::string> exchangeConfig(const std::string& mine);
  const Stats& stats() const { return stats_; }
  bool checkCalls() const { return checkCalls_; }
  // The kept buffers of this group's host-memory allreduces (algo/scratch.h): bytes held (as of
  // the end of the last call: never waits for the running one), and freeing them (after the call
  // running now, if any; the next call allocates afresh).
  int64_t scratchBytes() const { return scratchHeld_.load(); }
  // The threads the codec of the last quantized CPU allreduce could use (0 before the first).
  int cpuThreadsUsed() const { return cpuThreadsUsed_.load(); }
  int64_t releaseScratch();
  void resetStats();
  // Shadow mode's statistics, keyed "<dtype> <size class>" (e.g. "float32 4 MiB to 8 MiB"),
  // prefixed for reduce-scatters and all-gathers ("reduce_scatter float32 4 MiB to 8 MiB").
  std::map<std::string, ShadowStat> shadowStats() const;
  // The sequence number the next quantized allreduce will carry (it seeds stochastic rounding).
  uint32_t nextCallSeq() const { return callSeq_; }
  // The plan an allreduce of this tensor would take now (for tests and diagnostics); useTable
  // false: the plan of the config alone, as if the tuning table were empty.
  // config: the config to plan with (the group's live one when null).
  Plan planFor(const at::Tensor& t, c10d::ReduceOp op, bool useTable = true,
               const QuantConfig* config = nullptr) const;

  // The tuner (tuner.cpp, plan/tuning.h): host-memory allreduces only (a CUDA allreduce with
  // `auto` runs two_step, untuned). The table every rank of the group holds alike.
  std::vector<TuneEntry> tuningEntries() const;
  // Entries every rank loads alike (qcomm's cache, read by rank 0 and shared through the store).
  void loadTuning(const std::vector<TuneEntry>& entries);
  // Rank 0 writes the table to `path` (JSON, under `keyJson`) after each measurement; "" never.
  void setTuningCache(const std::string& path, const std::string& keyJson);
  std::string tuningCachePath() const;
  // Measures now (collective: every rank calls it with the same host tensor shape and dtype)
  // which of exact and the quantized candidates is fastest for calls of `collective` (plan.h
  // Collective) of this message's dtype and size class (a reduce-scatter's input, an
  // all-gather's output: numel a multiple of the world), and enters the choice in the table,
  // replacing any earlier one.
  void tune(const at::Tensor& sample, int32_t collective = kAllreduce);
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

  // reduce-scatter and all-gather: quantized where the config opts in (sharded.cpp), else passed
  // through
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
  // The plan a reduce-scatter (collective kReduceScatter) or all-gather would take now (with
  // useTable: as the tuning table says; else as the config says).
  Plan planForSharded(int32_t collective, const at::Tensor& message, const at::Tensor& shard,
                      c10d::ReduceOp op, bool shapeOk = true, bool useTable = true,
                      const QuantConfig* config = nullptr) const;

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

  bool supportsCoalescing() const override { return nccl_ != nullptr; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  void shutdown() override;
  void abort() override;

 private:
  // The test hooks (csrc/python/testing.cpp) reach the state they set through this one friend:
  // the class has no methods for tests.
  friend struct BackendTestAccess;
  // The host agreement of a quantized CUDA call, where the CUDA path has one (backend_cuda.cpp:
  // the NCCL transport, the fused experiment, groups that check their calls): the call's header
  // exchanged over Gloo on the progress thread, behind the host-memory calls queued there (the
  // caller waits), so that Gloo pairs every rank's collectives in the same order; a disagreement
  // raises on every rank alike. In every build: the test hooks run it with a host tensor's plan
  // (qcomm._C._testing.agree_as_cuda_calls_do).
  void agreeOnCudaCall(const Plan& plan, std::chrono::milliseconds timeout);
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
  // `collective`: prefixed to the key of calls other than allreduces ("reduce_scatter").
  void recordShadow(const Plan& plan, const at::Tensor& result, const at::Tensor& exact,
                    double exactSeconds, const std::string& collective = "");
  c10::intrusive_ptr<c10d::Work> allreduceCuda(Plan plan, std::vector<at::Tensor>& tensors,
                                               const c10d::AllreduceOptions& opts);
  // allreduceCuda's launches, once the call is agreed: `msg` stages tensors[0] (staging.h).
  c10::intrusive_ptr<c10d::Work> launchCuda(const Plan& plan, std::vector<at::Tensor>& tensors,
                                            Staged& msg, CudaPath& path, bool useIpc,
                                            const c10d::AllreduceOptions& opts,
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
  // Runs a quantized call's `run` on the progress thread in issue order (at once where the caller
  // is that thread: a future's callback), failing `work` with what it throws; waits for it unless
  // `asyncOp` (a synchronous call raises its error here).
  c10::intrusive_ptr<c10d::Work> queueCall(std::function<void()> run,
                                           const c10::intrusive_ptr<QueuedWork>& work,
                                           bool asyncOp);
  // agreeOnPlan over Gloo on the calling thread (the progress thread's own calls).
  std::string agreeHere(const Plan& plan, std::chrono::milliseconds timeout);
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
  // copies of `sample`, on the progress thread, unless `onlyIfMissing` and it is in the table.
  void measureClass(const Plan& plan, const at::Tensor& sample, std::chrono::milliseconds timeout,
                    bool onlyIfMissing);
  // On the progress thread, before an allreduce of a class the tuner decides (`plan`: the
  // config's plan, with the call's number): measures a class not in the table, checks an entry
  // loaded from the cache (checkClass), and at the agreed calls compares the class's real calls
  // with what the tuning measured (driftCheck). Every rank runs it at the same call.
  void settleClass(const Plan& plan, const at::Tensor& sample, std::chrono::milliseconds timeout);
  void checkClass(const Plan& plan, const at::Tensor& sample, std::chrono::milliseconds timeout);
  void driftCheck(const Plan& plan, const at::Tensor& sample, std::chrono::milliseconds timeout);
  // The duration of a real call of a tuned class (on the progress thread), for driftCheck.
  void noteCallTime(int32_t dtype, int32_t sizeClass, double seconds,
                    int32_t collective = kAllreduce);
  // One run of a tuning candidate of `collective` on `work` (the message): the exact inner
  // collective where the candidate does not quantize, else its quantized run, counted nowhere.
  void runForTuning(const Plan& candidate, int32_t collective, at::Tensor& work,
                    std::chrono::milliseconds timeout);
  // On the progress thread, a sharded call of a class the tuner decides (plan.tuneNeeded):
  // settles the class, then runs the call as the table now says, timed for driftCheck.
  std::string runTunedSharded(Plan plan, ShardedCall& call);
  // The exact inner allreduce of a CPU tensor, on the progress thread (a class tuned to exact).
  void exactOnQueue(at::Tensor& t, const c10d::AllreduceOptions& opts);
  void saveTuning() const;
  CallFacts factsOf(const at::Tensor& t, c10d::ReduceOp op) const;
  // The sharded path (sharded.cpp): plan, pass through or queue the quantized run.
  c10::intrusive_ptr<c10d::Work> sharded(ShardedCall call);
  c10::intrusive_ptr<c10d::Work> passThroughSharded(ShardedCall& call);
  // On the progress thread: agreement, the run, the copies back, stats ("" when the ranks agree).
  // count false (the tuner's runs): no stats, no shadow.
  std::string runShardedCpu(const Plan& plan, ShardedCall& call, bool count = true);
  // A quantized reduce-scatter or all-gather, host or CUDA tensors alike (on the current stream
  // for CUDA ones): its buffers staged before anything is exchanged (the caller's tensors, or
  // contiguous copies; the all-gather's input in its slot), then the schedule on `ops`' device and
  // the result written into the caller's output.
  ShardedStage stageSharded(const Plan& plan, const ShardedCall& call) const;
  void runSharded(const Plan& plan, ShardedCall& call, ShardedStage& st, Transport& transport,
                  CodecOps& ops, Scratch* scratch);
  // stats() of a quantized reduce-scatter or all-gather
  void countSharded(const Plan& plan, const ShardedCall& call, int64_t wireBytes);
  // The CUDA form of the sharded path (backend_cuda.cpp): the allreduce's transport, agreement
  // and streams (allreduceCuda), the schedule of runSharded.
  c10::intrusive_ptr<c10d::Work> shardedCuda(const Plan& plan, ShardedCall& call);
  // A CUDA call failed before its launches were shared with the peers: the group's IPC transport
  // (if set up) is abandoned with the error, so that peers waiting on this rank stop.
  void abandonIpc(const std::exception& e);
  void logSharded(const Plan& plan, const ShardedCall& call);
  // Shadow mode: the inner backend's exact result of the call, on copies of its input.
  at::Tensor exactOf(const ShardedCall& call);

  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::Backend> gloo_;
  c10::intrusive_ptr<c10d::Backend> nccl_;
  c10::intrusive_ptr<c10d::Store> store_;
  mutable std::mutex cudaMutex_;
  std::unique_ptr<CudaPath, CudaPathDeleter> cuda_;
  std::string cudaSetupError_;  // the set-up failed: every later CUDA allreduce raises this
  mutable std::mutex configMutex_;
  QuantConfig config_;
  int64_t configExchanges_ = 0;  // exchangeConfig's calls so far (on the progress thread)
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
  // allreduces issued here that the config quantizes (the table aside: a class tuned to exact
  // counts too, so the number does not depend on when a rank read the table); seeds the rounding
  // noise and picks the calls shadow mode shadows
  std::atomic<uint32_t> callSeq_{0};
  mutable std::mutex scratchMutex_;  // held by the call that uses scratch_
  Scratch scratch_;
  std::atomic<int64_t> scratchHeld_{0};  // scratch_.bytesHeld() after the last change
  mutable std::mutex tuningMutex_;       // guards the five below
  TuningTable tuning_;
  std::string tuneFile_, tuneKey_;
  // the test hooks' factors: this rank's measured time of candidate i (tuning and checks) is
  // multiplied by tuneTimingFactors_[i]; the duration of each real call tracked for drift, by
  // callTimingFactor_ (BackendTestAccess)
  std::vector<double> tuneTimingFactors_;
  double callTimingFactor_ = 1.0;
  // Per (collective, dtype, size class), on the progress thread only: the real calls' durations
  // since the last drift check, the calls of the class so far, the call of the next check and the
  // interval (doubled after each re-tune: a back-off).
  struct Drift {
    std::vector<double> seconds;
    int64_t calls = 0;
    int64_t nextCheck = 0;
    int64_t interval = 0;
  };
  std::map<std::tuple<int32_t, int32_t, int32_t>, Drift> drift_;  // (collective, dtype, class)
  mutable std::mutex brokenMutex_;
  std::string broken_;  // the first transport failure of a quantized allreduce
  // last, so that it stops (and joins its thread) before the members its tasks use go
  ProgressQueue queue_;
};

}  // namespace qcomm
