// The gather phase shared by two_step, ring and semi_ring.
#include <ATen/ATen.h>

#include "algorithms.h"
#include "codec_cpu.h"

namespace qcomm {

at::Tensor byteBuffer(int64_t bytes) { return at::empty({bytes}, at::kByte); }

void gatherPhase(const Plan& plan, Transport& t, float* ownSum, void* data) {
  const int world = plan.world;
  const ChunkRange own = plan.chunk(t.rank());
  divideByWorld(plan, ownSum, own.len);
  const int64_t slot = alignUp16(encodedBytes(plan.chunkElems, plan.ag));
  at::Tensor send = byteBuffer(slot);
  at::Tensor recv = byteBuffer(slot * world);
  encodeBlock(ownSum, kFloat32, own.len, plan.ag, send.data_ptr<uint8_t>(),
              agNoise(plan, t.rank(), own.begin));
  t.allGather(recv, send, "all-gather of the gather phase");
  const uint8_t* base = recv.data_ptr<uint8_t>();
  std::vector<float> scratch;
  for (int c = 0; c < world; ++c) {
    const ChunkRange ch = plan.chunk(c);
    decodeToOutput(plan, base + c * slot, ch, data, scratch);
  }
}

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
  if (!plan.average) return;
  const float w = float(plan.world);
  for (int64_t i = 0; i < len; ++i) sum[i] = sum[i] / w;
}

}  // namespace qcomm
