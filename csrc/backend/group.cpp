// Group (group.h): the checks, the queue and the agreement every call of a group uses.
#include "backend/group.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <omp.h>
#include <torch/csrc/distributed/c10d/debug.h>

#include <cstring>
#include <future>
#include <memory>

#include "backend/work.h"
#include "common/errors.h"
#include "common/settings.h"
#include "transport/c10d_transport.h"

namespace qcomm {

Group::Group(int rank, int size, std::chrono::milliseconds timeout,
             c10::intrusive_ptr<c10d::Backend> gloo, c10::intrusive_ptr<c10d::Backend> nccl,
             c10::intrusive_ptr<c10d::Store> store, const QuantConfig& config, bool disabled,
             int cpuThreads, int checkCalls)
    : rank(rank),
      size(size),
      timeout(timeout),
      gloo(std::move(gloo)),
      nccl(std::move(nccl)),
      store(std::move(store)),
      disabled(disabled),
      checkCalls(checkCalls >= 0 ? checkCalls != 0
                                 : (settings::text("QCOMM_DEBUG") == "CHECK" ||
                                    c10d::debug_level() == c10d::DebugLevel::Detail)),
      cpuThreads(cpuThreads),
      config_(config) {
  TORCH_CHECK_VALUE(cpuThreads >= 0, prefix(), "cpu_threads must be >= 0, got ", cpuThreads);
  TORCH_CHECK(this->gloo, prefix(), "qnccl needs an inner Gloo backend");
  validateConfig(config_);
}

std::string Group::prefix() const { return rankPrefix(rank, size); }

QuantConfig Group::config() const {
  std::lock_guard<std::mutex> lock(configMutex_);
  return config_;
}

void Group::setConfig(const QuantConfig& config) {
  validateConfig(config);
  std::lock_guard<std::mutex> lock(configMutex_);
  config_ = config;
}

void Group::checkOpen(const char* op) const {
  TORCH_CHECK(!shutDown, prefix(), op, ": the process group has been shut down");
}

void Group::checkUsable(const char* op) const {
  std::lock_guard<std::mutex> lock(brokenMutex_);
  TORCH_CHECK(broken_.empty(), prefix(), op,
              ": this group cannot be used after an earlier quantized collective on it failed on "
              "the wire (",
              broken_, "); destroy it and create a new one");
}

void Group::breakWith(const std::string& why) {
  std::lock_guard<std::mutex> lock(brokenMutex_);
  if (broken_.empty()) broken_ = why.substr(0, why.find('\n'));
}

void Group::refuseOverlap(const std::vector<at::Tensor>& ts, const char* op) const {
  for (const at::Tensor& t : ts) {
    TORCH_CHECK_VALUE(
        t.layout() != at::kStrided || at::has_internal_overlap(t) != at::MemOverlap::Yes, prefix(),
        op, ": a tensor whose elements overlap in memory (an expanded view: stride 0 over ",
        t.sizes(), ") cannot be sent or written into; pass t.clone() or t.contiguous()");
  }
}

void Group::refuseOverlap(const std::vector<std::vector<at::Tensor>>& ts, const char* op) const {
  for (const auto& v : ts) refuseOverlap(v, op);
}

c10d::Backend* Group::pick(const at::Tensor& t, const char* op) const {
  checkOpen(op);
  if (t.is_cuda()) {
    TORCH_CHECK(nccl, prefix(), op,
                ": got a CUDA tensor but this qnccl group has no NCCL backend (CUDA was not "
                "available when the group was created)");
    return nccl.get();
  }
  TORCH_CHECK_VALUE(t.device().is_cpu(), prefix(), op, ": tensors on ", t.device(),
                    " are not supported; qnccl takes CPU and CUDA tensors");
  return gloo.get();
}

c10d::Backend* Group::pickAll(const std::vector<at::Tensor>& ts, const char* op) {
  TORCH_CHECK(!ts.empty(), prefix(), op, ": no tensors given");
  checkUsable(op);
  refuseOverlap(ts, op);
  stats.passthroughCalls++;
  return pick(ts.front(), op);
}

Group::Issued Group::forward(c10d::Backend* inner, const char* op, c10d::OpType type,
                             std::vector<at::Tensor> outputs,
                             std::function<Issued(c10d::Backend*)> issue) {
  if (inner != gloo.get() || queue.idle() || queue.onThread()) {
    Issued w = issue(inner);
    if (w) return w;
    return c10::make_intrusive<CompletedWork>(rank, std::move(outputs));
  }
  auto work = queuedWork(type, internTitle(std::string("qnccl:") + op), {}, outputs);
  queue.push(
      [inner, type, issue = std::move(issue), work] {
        Issued w = issue(inner);
        int source = -1;
        if (w) {
          w->wait();
          if (type == c10d::OpType::RECVANYSOURCE) source = w->sourceRank();
        }
        work->complete(source);
      },
      [work](const std::exception_ptr& e) { work->fail(e); });
  return work;
}

Group::Issued Group::passThrough(const char* op, c10d::OpType type,
                                 const std::vector<at::Tensor>& given,
                                 const std::vector<at::Tensor>& written,
                                 std::vector<at::Tensor> outputs,
                                 std::function<Issued(c10d::Backend*)> issue) {
  refuseOverlap(written, op);
  return forward(pickAll(given, op), op, type, std::move(outputs), std::move(issue));
}

c10::intrusive_ptr<QueuedWork> Group::queuedWork(c10d::OpType type, const char* title,
                                                 std::vector<at::Tensor> inputs,
                                                 std::vector<at::Tensor> outputs) const {
  auto work =
      c10::make_intrusive<QueuedWork>(rank, type, title, std::move(inputs), std::move(outputs));
  work->setQueue(queue.identity());
  return work;
}

Group::Issued Group::queueCall(std::function<void()> run,
                               const c10::intrusive_ptr<QueuedWork>& work, bool asyncOp) {
  auto fail = [work](const std::exception_ptr& e) { work->fail(e); };
  if (queue.onThread()) {
    // issued from a callback on the progress thread (a future's then): nothing else can run now
    try {
      run();
    } catch (...) {
      fail(std::current_exception());
    }
  } else {
    queue.push(std::move(run), std::move(fail));
  }
  if (!asyncOp) work->wait();  // raises the call's error here, as the synchronous path did
  return work;
}

void Group::useCodecThreads() {
  // the codec's threads (at::parallel_for), this thread's alone: torch's count elsewhere is not
  // touched
  at::internal::lazy_init_num_threads();
  if (cpuThreads > 0 && at::get_num_threads() != cpuThreads) omp_set_num_threads(cpuThreads);
  cpuThreadsUsed = at::get_num_threads();
}

void Group::guardTransport(const std::function<void()>& body) {
  try {
    body();
  } catch (const c10::Error& e) {
    breakWith(e.what_without_backtrace());  // a transport failure: the peers' state is unknown
    throw;
  } catch (const std::exception& e) {
    breakWith(e.what());
    throw;
  }
}

std::string Group::agree(const Plan& plan, C10dTransport& t) {
  const PlanHeader mine = headerOf(plan);
  at::Tensor send = at::empty({int64_t(sizeof(PlanHeader))}, at::kByte);
  at::Tensor recv = at::empty({int64_t(sizeof(PlanHeader)) * size}, at::kByte);
  std::memcpy(send.data_ptr(), &mine, sizeof(PlanHeader));
  t.allGatherNow(recv, send, "exchange of the call's header (numel, dtype, op, config)");
  std::vector<PlanHeader> all(static_cast<size_t>(size));
  std::memcpy(all.data(), recv.data_ptr(), sizeof(PlanHeader) * all.size());
  return describeMismatch(all);
}

std::string Group::agreeHere(const Plan& plan, std::chrono::milliseconds timeout) {
  C10dTransport control(gloo.get(), rank, size, timeout, C10dTransport::kPointToPoint);
  return agree(plan, control);
}

std::string Group::agreeOnQueue(const Plan& plan, std::chrono::milliseconds timeout) {
  auto run = [this, &plan, timeout]() { return agreeHere(plan, timeout); };
  if (queue.onThread()) return run();
  auto result = std::make_shared<std::promise<std::string>>();
  std::future<std::string> done = result->get_future();
  // the caller waits below, so the task's references to plan stay valid
  queue.push([result, run]() { result->set_value(run()); },
             [result](const std::exception_ptr& e) { result->set_exception(e); });
  return done.get();
}

void Group::requireAgreement(const std::string& mismatch, const char* name,
                             int32_t collective) const {
  TORCH_CHECK(mismatch.empty(), prefix(), name, ": the ranks disagree on this call: ", mismatch,
              ". Every rank must pass the same ", collective == kAllreduce ? "numel" : "shapes",
              ", dtype and op, and hold the same QuantConfig (qcomm.set_config on every rank).");
}

int64_t Group::releaseScratch() {
  std::lock_guard<std::mutex> lock(scratchMutex);
  const int64_t held = scratch.bytesHeld();
  scratch.release();
  scratchHeld = scratch.bytesHeld();
  return held;
}

std::map<std::string, ShadowStat> Group::shadowStats() const {
  std::lock_guard<std::mutex> lock(shadowMutex);
  return shadow;
}

void Group::resetStats() {
  {
    std::lock_guard<std::mutex> lock(shadowMutex);
    shadow.clear();
  }
  for (std::atomic<int64_t>* c :
       {&stats.quantizedCalls, &stats.passthroughCalls, &stats.inputBytes, &stats.wireBytes,
        &stats.tunedClasses, &stats.tuneNanos, &stats.checkedClasses, &stats.checkNanos,
        &stats.retunedClasses}) {
    *c = 0;
  }
  for (CollectiveStats& c : stats.byCollective) {
    c.quantizedCalls = 0;
    c.passthroughCalls = 0;
    c.inputBytes = 0;
    c.wireBytes = 0;
  }
}

namespace {
std::string configKey(int64_t n, int r) {
  return "set_config/" + std::to_string(n) + "/" + std::to_string(r);
}
}  // namespace

std::vector<std::string> Group::exchangeConfig(const std::string& mine) {
  checkOpen("set_config");
  if (size == 1 || !store) return std::vector<std::string>(size_t(size), mine);
  std::vector<std::string> texts(static_cast<size_t>(size));
  auto work = queuedWork(c10d::OpType::UNKNOWN, "qnccl:set_config", {}, {});
  // the caller waits (queueCall with asyncOp false), so the task may hold references
  auto run = [this, &mine, &texts, work] {
    const int64_t n = configExchanges_++;  // on the queue: every rank counts alike
    store->set(configKey(n, rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    std::vector<std::string> keys;
    for (int r = 0; r < size; ++r) keys.push_back(configKey(n, r));
    try {
      store->wait(keys, timeout);
    } catch (const std::exception&) {
      std::string missing;
      for (int r = 0; r < size; ++r) {
        if (!store->check({keys[size_t(r)]})) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
      }
      TORCH_CHECK(false, prefix(), "set_config: rank(s) ", missing,
                  " did not call qcomm.set_config for this group within its timeout (",
                  timeout.count(),
                  " ms). It is collective: call it on every rank of the group, with the same "
                  "config, at the same point of their calls. This rank keeps its old config.");
    }
    for (int r = 0; r < size; ++r) {
      const std::vector<uint8_t> v = store->get(keys[size_t(r)]);
      texts[size_t(r)] = std::string(v.begin(), v.end());
    }
    // every rank has published its n-th: each read its (n-1)-th before, so this rank's can go
    if (n > 0) store->deleteKey(configKey(n - 1, rank));
    work->complete();
  };
  queueCall(std::move(run), work, false);
  return texts;
}

}  // namespace qcomm
