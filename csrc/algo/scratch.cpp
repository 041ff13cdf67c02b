// Scratch (scratch.h): slots reused across calls.
#include "algo/scratch.h"

namespace qcomm {

at::Tensor Scratch::take(int64_t bytes, const at::TensorOptions& options) {
  const at::TensorOptions byteOpts = options.dtype(at::kByte);
  if (bytes == 0) return at::empty({0}, byteOpts);
  if (next_ == slots_.size()) slots_.emplace_back();
  at::Tensor& slot = slots_[next_++];
  if (!slot.defined() || slot.numel() < bytes || slot.device() != byteOpts.device()) {
    slot = at::Tensor();  // the old slot goes before the larger one comes
    slot = at::empty({bytes}, byteOpts);
  }
  return slot.narrow(0, 0, bytes);
}

void Scratch::release() {
  slots_.clear();
  next_ = 0;
}

int64_t Scratch::bytesHeld() const {
  int64_t n = 0;
  for (const at::Tensor& s : slots_) n += s.defined() ? s.numel() : 0;
  return n;
}

}  // namespace qcomm
