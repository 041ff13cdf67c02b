// The gather phase shared by two_step, ring and semi_ring.
#include <ATen/ATen.h>

#include "algorithms.h"
#include "codec_cpu.h"

namespace qcomm {

at::Tensor byteBuffer(int64_t bytes) { return at::empty({bytes}, at::kByte); }

void gatherPhase(const Plan& plan, Transport& t, float* ownSum, void* data) {
  const int world = plan.world;
  const ChunkRange own = plan.chunk(t.rank());
  if (plan.average) {
    const float w = float(world);
    for (int64_t i = 0; i < own.len; ++i) ownSum[i] = ownSum[i] / w;
  }
  const int64_t slot = alignUp16(encodedBytes(plan.chunkElems, plan.ag));
  at::Tensor send = byteBuffer(slot);
  at::Tensor recv = byteBuffer(slot * world);
  encodeBlock(ownSum, kFloat32, own.len, plan.ag, send.data_ptr<uint8_t>());
  t.allGather(recv, send, "all-gather of the gather phase");
  const uint8_t* base = recv.data_ptr<uint8_t>();
  std::vector<float> scratch;
  if (plan.dtype != kFloat32) scratch.resize(size_t(plan.chunkElems));
  for (int c = 0; c < world; ++c) {
    const ChunkRange ch = plan.chunk(c);
    if (ch.len == 0) continue;
    void* out = elemPtr(data, plan.dtype, ch.begin);
    if (plan.dtype == kFloat32) {
      decodeBlock(base + c * slot, ch.len, plan.ag, static_cast<float*>(out), false);
    } else {
      decodeBlock(base + c * slot, ch.len, plan.ag, scratch.data(), false);
      castFromFloat(scratch.data(), ch.len, plan.dtype, out);
    }
  }
}

}  // namespace qcomm
