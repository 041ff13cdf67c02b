// "Pad, run, copy back", written once for every quantized call (the allreduce, reduce-scatter and
// all-gather; host and CUDA tensors; the test hooks that run a schedule as the backend does): the
// contiguous buffer a schedule runs on in place of a caller's tensor, and the copy of its result
// back into that tensor.
#pragma once

#include <ATen/ATen.h>

#include "plan/plan.h"

namespace qcomm {

class Staged {
 public:
  Staged() = default;
  // The buffer a schedule runs on for t: t itself where it is contiguous, else a contiguous copy.
  // The copy runs now (on the current stream for a CUDA tensor).
  explicit Staged(const at::Tensor& t);
  // The message of `plan` for t (plan.userNumel elements): as above where the plan needs no
  // padding, else (a rotated message that ends inside a group) t's elements then zeros up to
  // plan.numel (algo/algorithms.h paddedCopy), in `storage` when given (plan.numel elements of
  // t's dtype on t's device, kept by the caller), else newly allocated.
  Staged(const Plan& plan, const at::Tensor& t, at::Tensor storage = {});

  at::Tensor& data() { return data_; }
  const at::Tensor& user() const { return user_; }
  // Whether data() is a copy (finish() then has a copy to make).
  bool copied() const { return !data_.is_same(user_); }
  // Writes the schedule's result (data's first t.numel() elements) into t; nothing where data()
  // is t itself.
  void finish();

 private:
  at::Tensor user_;
  at::Tensor data_;
  bool padded_ = false;
  Plan plan_;  // where data_ is a padded copy: its plan
};

}  // namespace qcomm
