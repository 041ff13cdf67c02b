// ProgressQueue: the thread of one qnccl group that runs its host-memory collectives, one at a
// time, in the order they were issued, while the caller goes on (as Gloo's worker threads run
// its collectives). The thread starts at the first task and ends at stop().
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace qcomm {

class ProgressQueue {
 public:
  // `run` does the work; if it throws, `fail` gets the error. A task not run (the queue stopped
  // past its grace) gets `fail` with the reason stop() was given.
  using Run = std::function<void()>;
  using Fail = std::function<void(std::exception_ptr)>;

  ProgressQueue() = default;
  ProgressQueue(const ProgressQueue&) = delete;
  ProgressQueue& operator=(const ProgressQueue&) = delete;
  ~ProgressQueue();  // stop(0, ...) if not stopped

  // Queues a task behind every task pushed before it. Throws once stop() has begun.
  void push(Run run, Fail fail);
  // Nothing queued and nothing running.
  bool idle() const;
  // The caller is the queue's own thread (a future's callback issuing a collective).
  bool onThread() const;
  // What names this queue, and the queue whose thread the caller is (null on any other thread):
  // a Work of this queue waited for on its own thread would wait for itself (QueuedWork::wait).
  const void* identity() const { return s_.get(); }
  static const void* current();
  // On the thread of the queue `identity` (a future's callback waiting for a later call of the
  // same group): runs the tasks queued there, in their order, until `done()` or none is left;
  // returns done(). On any other thread: returns done() and runs nothing. The awaited call runs
  // inline, behind the calls issued before it, as it would have on the thread, instead of
  // waiting for a thread that waits for it.
  static bool runUntil(const void* identity, const std::function<bool()>& done);
  // Takes no more tasks, runs those queued until `grace` has passed, fails the rest with
  // `why`, and joins the thread (from the thread itself: lets it end on its own).
  void stop(std::chrono::milliseconds grace, const std::string& why);

  // Progress threads alive in this process (a test counts them after destroy_process_group).
  static int64_t liveThreads();

 private:
  struct State {
    std::mutex m;
    std::condition_variable cv;
    std::deque<std::pair<Run, Fail>> tasks;
    bool running = false;
    bool stopping = false;
    std::chrono::steady_clock::time_point deadline;
    std::string why;
    std::thread::id id;
  };
  static void loop(const std::shared_ptr<State>& s);
  // Runs `task`: its fail gets what its run throws, or `why` where it is `late`.
  static void runTask(std::pair<Run, Fail>& task, bool late, const std::string& why);

  std::shared_ptr<State> s_ = std::make_shared<State>();
  std::thread thread_;
  std::mutex startMutex_;
};

}  // namespace qcomm
