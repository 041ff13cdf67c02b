// ProgressQueue: one thread per group, started on first use, tasks in issue order.
#include "backend/progress.h"

#include <atomic>
#include <stdexcept>
#include <utility>

namespace qcomm {
namespace {
std::atomic<int64_t> liveProgressThreads{0};
thread_local const void* currentQueue = nullptr;  // the queue whose thread this is
}  // namespace

const void* ProgressQueue::current() { return currentQueue; }

void ProgressQueue::runTask(std::pair<Run, Fail>& task, bool late, const std::string& why) {
  if (late) {
    task.second(std::make_exception_ptr(std::runtime_error(why)));
    return;
  }
  try {
    task.first();
  } catch (...) {
    task.second(std::current_exception());
  }
}

bool ProgressQueue::runUntil(const void* identity, const std::function<bool()>& done) {
  if (identity == nullptr || currentQueue != identity) return done();
  // the queue's State outlives its thread's loop (loop holds a shared_ptr), and this is that
  // thread: the pointer is alive
  State* s = static_cast<State*>(const_cast<void*>(identity));
  while (!done()) {
    std::pair<Run, Fail> task;
    bool late = false;
    std::string why;
    {
      std::lock_guard<std::mutex> lock(s->m);
      if (s->tasks.empty()) break;
      task = std::move(s->tasks.front());
      s->tasks.pop_front();
      late = s->stopping && std::chrono::steady_clock::now() >= s->deadline;
      why = s->why;
    }
    runTask(task, late, why);
  }
  return done();
}

int64_t ProgressQueue::liveThreads() { return liveProgressThreads.load(); }

ProgressQueue::~ProgressQueue() { stop(std::chrono::milliseconds(0), "the group was destroyed"); }

void ProgressQueue::push(Run run, Fail fail) {
  {
    std::lock_guard<std::mutex> lock(s_->m);
    if (s_->stopping) throw std::runtime_error("the group is shutting down");
    s_->tasks.emplace_back(std::move(run), std::move(fail));
  }
  {
    std::lock_guard<std::mutex> lock(startMutex_);
    if (!thread_.joinable()) {
      liveProgressThreads.fetch_add(1);
      std::shared_ptr<State> s = s_;
      thread_ = std::thread([s] {
        loop(s);
        liveProgressThreads.fetch_sub(1);
      });
    }
  }
  s_->cv.notify_all();
}

bool ProgressQueue::idle() const {
  std::lock_guard<std::mutex> lock(s_->m);
  return s_->tasks.empty() && !s_->running;
}

bool ProgressQueue::onThread() const {
  std::lock_guard<std::mutex> lock(s_->m);
  return s_->id == std::this_thread::get_id();
}

void ProgressQueue::loop(const std::shared_ptr<State>& s) {
  std::unique_lock<std::mutex> lock(s->m);
  s->id = std::this_thread::get_id();
  currentQueue = s.get();
  for (;;) {
    s->cv.wait(lock, [&] { return !s->tasks.empty() || s->stopping; });
    if (s->tasks.empty()) break;  // stopping, nothing left
    std::pair<Run, Fail> task = std::move(s->tasks.front());
    s->tasks.pop_front();
    const bool late = s->stopping && std::chrono::steady_clock::now() >= s->deadline;
    const std::string why = s->why;
    s->running = true;
    lock.unlock();
    runTask(task, late, why);
    task = {};  // what the task held (tensors, the backend) goes here, on this thread
    lock.lock();
    s->running = false;
    s->cv.notify_all();
  }
}

void ProgressQueue::stop(std::chrono::milliseconds grace, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(s_->m);
    if (!s_->stopping) {
      s_->stopping = true;
      s_->deadline = std::chrono::steady_clock::now() + grace;
      s_->why = why;
    }
  }
  s_->cv.notify_all();
  std::lock_guard<std::mutex> lock(startMutex_);
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // the last reference went on the thread itself: it ends after this task
  } else {
    thread_.join();
  }
}

}  // namespace qcomm
