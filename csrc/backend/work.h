// Work objects: a collective queued on the group's progress thread (QueuedWork), one born complete
// (CompletedWork), and a quantized allreduce of CUDA tensors (CudaWork).
#pragma once

#include <functional>
#include <memory>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#ifdef QCOMM_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#endif

namespace qcomm {

// A collective that runs on the group's progress thread, as Gloo's AsyncWork behaves: wait()
// blocks until it ran and raises its error; isCompleted() polls; the future completes with the
// output tensors (or the error) on the progress thread, where the callbacks DDP's comm hooks chain
// run. The profiler's record (`title`, with the input tensors) spans issue to completion.
class QueuedWork : public c10d::Work {
 public:
  QueuedWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> inputs,
             std::vector<at::Tensor> outputs);

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  int sourceRank() const override;
  // Called on the thread of the queue that runs this work before it ran (a future's callback,
  // which runs on that thread, waiting for a later call of the same group, queued behind the
  // callback): runs the queued calls up to this one inline (ProgressQueue::runUntil) instead of
  // waiting for itself.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  // The ProgressQueue (identity()) this work is queued on.
  void setQueue(const void* queue) { queue_ = queue; }

  // Called once, on the progress thread, when the outputs are final (`sourceRank`: the sender
  // of a receive from any source).
  void complete(int sourceRank = -1);
  void fail(const std::exception_ptr& e);

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  int sourceRank_ = -1;
  const void* queue_ = nullptr;
};

// A title for the profiler's record that lives as long as the process (c10d::Work keeps the
// pointer): "qnccl:all_reduce two_step 8/8 g128".
const char* internTitle(const std::string& title);

class CompletedWork : public c10d::Work {
 public:
  CompletedWork(int rank, std::vector<at::Tensor> outputs);

  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override {}
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

#ifdef QCOMM_WITH_CUDA
// A quantized allreduce of CUDA tensors, as ProcessGroupNCCL's Work behaves: the kernels were
// enqueued on `stream` (a side stream for async ops, the caller's stream otherwise) and `done`
// recorded after them. wait() and synchronize() make the current stream wait for `done` without
// blocking the host; the future completes for DDP's hooks on the same terms; the tensors stay
// referenced until the Work goes. `check` raises an error a kernel recorded (host-mapped memory,
// read without synchronizing).
class CudaWork : public c10d::Work {
 public:
  CudaWork(int rank, std::vector<at::Tensor> outputs, std::shared_ptr<at::cuda::CUDAEvent> done,
           const c10::cuda::CUDAStream& stream, std::function<void()> check);

  bool isCompleted() override;
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds timeout) override;
  void synchronize() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<at::cuda::CUDAEvent> done_;
  std::function<void()> check_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};
#endif

}  // namespace qcomm
