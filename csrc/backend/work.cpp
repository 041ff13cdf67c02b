// CompletedWork: what DDP's comm hook and Megatron's handle.wait() see for a quantized allreduce.
#include "backend/work.h"

#ifdef QCOMM_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#endif

namespace qcomm {

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
