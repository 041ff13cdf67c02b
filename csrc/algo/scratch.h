// Scratch: the buffers of one group's host-memory allreduces, kept from one call to the next, so
// that a large call does not fault in fresh pages every time (an allocation of tens of MiB is a
// fresh mapping each time it is made). A call takes its buffers in order; the k-th buffer taken
// reuses slot k, which grows to the largest size asked of it and stays. release() frees them all.
// Used by one call at a time (the group's progress thread).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace qcomm {

class Scratch {
 public:
  // A new call: its first take() reuses slot 0.
  void begin() { next_ = 0; }
  // `bytes` bytes (uint8, 1-D, 64-byte aligned) on `options`' device, from the next slot.
  at::Tensor take(int64_t bytes, const at::TensorOptions& options);
  // Frees every slot (the next call allocates afresh).
  void release();
  // Bytes the slots hold now.
  int64_t bytesHeld() const;

 private:
  std::vector<at::Tensor> slots_;
  size_t next_ = 0;
};

}  // namespace qcomm
