// Group: the state a qnccl group's calls share, and the checks and plumbing every call uses. The
// backend (backend.h) owns one and routes calls; a quantized call (call.h) and the tuner
// (tuner.h) run on it. It holds no collective's logic: which call quantizes, and how, is
// call.cpp's; what is fastest, tuner.cpp's.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

#include "algo/scratch.h"
#include "backend/progress.h"
#include "plan/config.h"
#include "plan/plan.h"

namespace qcomm {

class C10dTransport;
class QueuedWork;

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
  std::atomic<int64_t> inputBytes{0};      // bytes of the tensors given to quantized calls
  std::atomic<int64_t> wireBytes{0};       // bytes this rank sent for quantized calls
  std::atomic<int64_t> tunedClasses{0};    // size classes this rank measured (plan/tuning.h)
  std::atomic<int64_t> tuneNanos{0};       // time those measurements took
  std::atomic<int64_t> checkedClasses{0};  // cached entries confirmed by the check at first use
  std::atomic<int64_t> checkNanos{0};      // time those checks took (re-tunes not included)
  std::atomic<int64_t> retunedClasses{0};  // classes measured again: check or drift disagreed
  // per collective (stats()["by_collective"]), indexed by Collective: every call of each form
  // (single, coalesced, list), quantized or passed through; also counted in the totals above,
  // which count every other operation (broadcast, barrier, ...) too
  CollectiveStats byCollective[3];
};

// Shadow mode (QuantConfig.shadow): the error of the shadowed calls of one collective, dtype and
// size class, against the exact collective of the same input (over the elements whose exact
// result is finite).
struct ShadowStat {
  int64_t calls = 0;
  double relL2Sum = 0;  // sum over calls of |q - exact|_2 / |exact|_2
  double relL2Max = 0;
  double maxAbs = 0;   // the largest |q - exact| of any element of any call
  double seconds = 0;  // the time the exact collectives and comparisons took
};

class Group {
 public:
  using Issued = c10::intrusive_ptr<c10d::Work>;

  // disabled (QCOMM_DISABLE=1 at the group's creation): every collective passes through.
  // cpuThreads: the threads the codec of a quantized host call uses (0: torch's intra-op count).
  // checkCalls: whether eager CUDA calls exchange their header on the host first (-1: this
  // process's settings, QCOMM_DEBUG=CHECK or TORCH_DISTRIBUTED_DEBUG=DETAIL).
  Group(int rank, int size, std::chrono::milliseconds timeout,
        c10::intrusive_ptr<c10d::Backend> gloo, c10::intrusive_ptr<c10d::Backend> nccl,
        c10::intrusive_ptr<c10d::Store> store, const QuantConfig& config, bool disabled,
        int cpuThreads, int checkCalls);

  const int rank, size;
  const std::chrono::milliseconds timeout;
  const c10::intrusive_ptr<c10d::Backend> gloo, nccl;
  const c10::intrusive_ptr<c10d::Store> store;
  const bool disabled;
  const bool checkCalls;
  const int cpuThreads;

  std::string prefix() const;
  QuantConfig config() const;
  void setConfig(const QuantConfig& config);
  std::chrono::milliseconds timeoutOf(std::chrono::milliseconds given) const {
    return given == c10d::kUnsetTimeout ? timeout : given;
  }

  // ---- checks every call makes ----
  // Raises once the group was shut down.
  void checkOpen(const char* op) const;
  // Raises once a quantized call of this group failed in its transport.
  void checkUsable(const char* op) const;
  // Refuses tensors whose elements overlap in memory (expanded views), which Gloo would crash on,
  // before anything is sent: a ValueError naming the rank and the op.
  void refuseOverlap(const std::vector<at::Tensor>& ts, const char* op) const;
  void refuseOverlap(const std::vector<std::vector<at::Tensor>>& ts, const char* op) const;
  // The inner backend of a tensor's device.
  c10d::Backend* pick(const at::Tensor& t, const char* op) const;
  // Counts a pass-through call and picks the inner backend for the first tensor.
  c10d::Backend* pickAll(const std::vector<at::Tensor>& ts, const char* op);

  // ---- the progress queue ----
  // A pass-through call. CUDA tensors, and host tensors while nothing of this group is queued,
  // go to the inner backend at once; host tensors behind queued work wait in the queue, so the
  // inner Gloo sees this rank's calls in the order they were issued (its collectives match by
  // order). `outputs`: what the queued Work's result() and future give.
  Issued forward(c10d::Backend* inner, const char* op, c10d::OpType type,
                 std::vector<at::Tensor> outputs, std::function<Issued(c10d::Backend*)> issue);
  // A collective qnccl never quantizes: `written` checked for overlap (refuseOverlap), then
  // forward with the inner backend of `given`'s device (pickAll: counted, checked), `op` naming
  // it in errors and in the profiler's record.
  Issued passThrough(const char* op, c10d::OpType type, const std::vector<at::Tensor>& given,
                     const std::vector<at::Tensor>& written, std::vector<at::Tensor> outputs,
                     std::function<Issued(c10d::Backend*)> issue);
  // Runs a call's `run` on the progress thread in issue order (at once where the caller is that
  // thread: a future's callback), failing `work` with what it throws; waits for it unless
  // `asyncOp` (a synchronous call raises its error here).
  Issued queueCall(std::function<void()> run, const c10::intrusive_ptr<QueuedWork>& work,
                   bool asyncOp);
  // A Work of this group's queue.
  c10::intrusive_ptr<QueuedWork> queuedWork(c10d::OpType type, const char* title,
                                            std::vector<at::Tensor> inputs,
                                            std::vector<at::Tensor> outputs) const;
  // On the progress thread: the codec's thread count for this group (cpuThreads).
  void useCodecThreads();
  // Runs `body`; a transport failure in it breaks the group (checkUsable).
  void guardTransport(const std::function<void()>& body);

  // ---- the ranks' agreement on a call ----
  // Exchanges the plan's header over `t`; returns the difference, if ranks disagree ("" if not).
  std::string agree(const Plan& plan, C10dTransport& t);
  // agree over Gloo on the calling thread (the progress thread's own calls).
  std::string agreeHere(const Plan& plan, std::chrono::milliseconds timeout);
  // agree over Gloo, run on the progress thread behind the host-memory calls queued there (the
  // caller waits): a call from another thread (the CUDA path's) keeps Gloo's order of
  // collectives the same on every rank.
  std::string agreeOnQueue(const Plan& plan, std::chrono::milliseconds timeout);
  // Raises the disagreement agree found (on every rank alike), for a call of `collective`.
  void requireAgreement(const std::string& mismatch, const char* name, int32_t collective) const;

  // ---- what the group keeps ----
  int64_t scratchBytes() const { return scratchHeld.load(); }
  int64_t releaseScratch();
  std::map<std::string, ShadowStat> shadowStats() const;
  void resetStats();
  // qcomm.set_config's agreement (backend.h exchangeConfig).
  std::vector<std::string> exchangeConfig(const std::string& mine);
  // Stops the queue: calls still queued run within `grace`, the rest fail with `why`.
  void stop(std::chrono::milliseconds grace, const std::string& why) { queue.stop(grace, why); }

  std::atomic<bool> shutDown{false};
  Stats stats;
  std::atomic<int> cpuThreadsUsed{0};
  // calls issued here that the config quantizes (the table aside: a class tuned to exact counts
  // too, so the number does not depend on when a rank read the table); seeds the rounding noise
  // and picks the calls shadow mode shadows
  std::atomic<uint32_t> callSeq{0};
  mutable std::mutex scratchMutex;  // held by the call that uses scratch
  Scratch scratch;
  std::atomic<int64_t> scratchHeld{0};  // scratch.bytesHeld() after the last change
  mutable std::mutex shadowMutex;
  std::map<std::string, ShadowStat> shadow;
  std::mutex logMutex;
  std::set<std::string> logged;  // the decisions logged (collective, size class, dtype, decision)
  int64_t eligibleCalls = 0;     // allreduces of fp32/fp16/bf16 dense tensors, SUM or AVG
  bool quietLogged = false;

 private:
  void breakWith(const std::string& why);

  mutable std::mutex configMutex_;
  QuantConfig config_;
  int64_t configExchanges_ = 0;  // exchangeConfig's calls so far (on the progress thread)
  mutable std::mutex brokenMutex_;
  std::string broken_;  // the first transport failure of a quantized call

 public:
  // last, so that it stops (and joins its thread) before the members its tasks use go
  ProgressQueue queue;
};

}  // namespace qcomm
