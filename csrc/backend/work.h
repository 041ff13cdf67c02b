// Work objects for quantized allreduce on host memory: the algorithm has already run when the Work
// is created, so it is born complete, with a completed future holding the output tensors.
#pragma once

#include <functional>
#include <memory>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#ifdef QCOMM_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#endif

namespace qcomm {

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
