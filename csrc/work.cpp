// CompletedWork: what DDP's comm hook and Megatron's handle.wait() see for a quantized allreduce.
#include "work.h"

namespace qcomm {

CompletedWork::CompletedWork(int rank, std::vector<at::Tensor> outputs)
    : c10d::Work(rank, c10d::OpType::ALLREDUCE, "qnccl:all_reduce"), outputs_(std::move(outputs)) {
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  future_->markCompleted(c10::IValue(outputs_));
  finish();
}

bool CompletedWork::wait(std::chrono::milliseconds /*timeout*/) { return true; }

}  // namespace qcomm
