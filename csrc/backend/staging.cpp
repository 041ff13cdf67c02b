// Staged (staging.h): the buffer a schedule runs on and the copy back.
#include "backend/staging.h"

#include "algo/algorithms.h"

namespace qcomm {

Staged::Staged(const at::Tensor& t) : user_(t), data_(t.is_contiguous() ? t : t.contiguous()) {}

Staged::Staged(const Plan& plan, const at::Tensor& t, at::Tensor storage) : user_(t) {
  if (!needsPadding(plan)) {
    data_ = t.is_contiguous() ? t : t.contiguous();
    return;
  }
  data_ = paddedCopy(plan, t, std::move(storage));
  padded_ = true;
  plan_ = plan;
}

void Staged::finish() {
  if (!copied()) return;
  if (padded_) {
    copyUnpadded(plan_, data_, user_);
  } else {
    user_.copy_(data_);
  }
}

}  // namespace qcomm
