// QueuedWork and CompletedWork: what DDP's comm hook and Megatron's handle.wait() see.
#include "backend/work.h"

#include <c10/util/Exception.h>

#include <mutex>
#include <set>

#include "backend/progress.h"

#ifdef QCOMM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#endif

namespace qcomm {

QueuedWork::QueuedWork(int rank, c10d::OpType type, const char* title,
                       std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, type, title, inputs), outputs_(std::move(outputs)) {
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

int QueuedWork::sourceRank() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sourceRank_;
}

bool QueuedWork::wait(std::chrono::milliseconds timeout) {
  // On the thread of its own queue (a future's callback waiting for a later call of the same
  // group), the call and those queued before it run here, inline, in their order: the thread
  // would otherwise wait for itself.
  const bool ran = ProgressQueue::runUntil(queue_, [this] { return isCompleted(); });
  TORCH_CHECK(queue_ == nullptr || ProgressQueue::current() != queue_ || ran,
              "[qcomm] Work.wait() was called on the qnccl group's progress thread (from a "
              "future's callback) for a collective of the same group that is not queued there: "
              "the wait could never end. Wait for it outside the callback");
  return c10d::Work::wait(timeout);
}

// The work is marked finished before its future completes, so that a callback of the future
// (run by markCompleted, on this thread) that waits for this same work returns at once.
void QueuedWork::complete(int sourceRank) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    sourceRank_ = sourceRank;
  }
  finish();
  future_->markCompleted(c10::IValue(outputs_));
}

void QueuedWork::fail(const std::exception_ptr& e) {
  finish(e);
  future_->setError(e);
}

const char* internTitle(const std::string& title) {
  static std::mutex m;
  static std::set<std::string>* titles = new std::set<std::string>();  // never freed
  std::lock_guard<std::mutex> lock(m);
  return titles->insert(title).first->c_str();
}

CompletedWork::CompletedWork(int rank, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, c10d::OpType::ALLREDUCE, "qnccl:all_reduce"), outputs_(std::move(outputs)) {
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  future_->markCompleted(c10::IValue(outputs_));
  finish();
}

bool CompletedWork::wait(std::chrono::milliseconds /*timeout*/) { return true; }

#ifdef QCOMM_WITH_CUDA
CudaWork::CudaWork(int rank, std::vector<at::Tensor> outputs,
                   std::shared_ptr<at::cuda::CUDAEvent> done, const c10::cuda::CUDAStream& stream,
                   std::function<void()> check)
    : c10d::Work(rank, c10d::OpType::ALLREDUCE, "qnccl:all_reduce"),
      outputs_(std::move(outputs)),
      done_(std::move(done)),
      check_(std::move(check)) {
  // As ProcessGroupNCCL does: a CUDA-aware future, completed with the work's stream current, so
  // that its waiters and callbacks are ordered after the kernels, not after the host.
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                     std::vector<c10::Device>{stream.device()});
  c10::cuda::CUDAStreamGuard guard(stream);
  future_->markCompleted(c10::IValue(outputs_));
}

bool CudaWork::isCompleted() { return done_->query(); }

bool CudaWork::wait(std::chrono::milliseconds /*timeout*/) {
  synchronize();
  return true;
}

void CudaWork::synchronize() {
  if (check_) check_();
  done_->block(c10::cuda::getCurrentCUDAStream(done_->device_index()));
}
#endif

}  // namespace qcomm
