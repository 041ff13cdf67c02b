// Helpers shared by two_step, ring and semi_ring.
#include <ATen/ATen.h>

#include "algo/algorithms.h"
#include "codec/codec_cpu.h"

namespace qcomm {

at::Tensor byteBuffer(int64_t bytes) { return at::empty({bytes}, at::kByte); }

void decodeToOutput(const Plan& plan, const uint8_t* bytes, ChunkRange range, void* data,
                    std::vector<float>& scratch) {
  if (range.len == 0) return;
  void* out = elemPtr(data, plan.dtype, range.begin);
  if (plan.dtype == kFloat32) {
    decodeBlock(bytes, range.len, plan.ag, static_cast<float*>(out), false);
    return;
  }
  if (scratch.size() < size_t(range.len)) scratch.resize(size_t(range.len));
  decodeBlock(bytes, range.len, plan.ag, scratch.data(), false);
  castFromFloat(scratch.data(), range.len, plan.dtype, out);
}

void divideByWorld(const Plan& plan, float* sum, int64_t len) {
  if (plan.average) divideBy(sum, len, float(plan.world));
}

}  // namespace qcomm
