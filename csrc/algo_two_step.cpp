// two_step (Flash Communication): two quantization round trips whatever the world size.
//
// Schedule, W ranks, one chunk per rank (chunk c is owned by rank c):
//   1. every rank encodes each of its W chunks with the reduce codec into W equal slots;
//   2. all-to-all: rank c receives slot c from every rank;
//   3. rank c decodes the W copies of chunk c to fp32 and sums them in rank order 0..W-1;
//   4. gather phase (algo_common.cpp): encode the sum, all-gather, everyone decodes every chunk.
#include <ATen/ATen.h>

#include "algorithms.h"
#include "codec_cpu.h"

namespace qcomm {

void runTwoStep(const Plan& plan, Transport& t, void* data) {
  const int world = plan.world;
  const ChunkRange own = plan.chunk(t.rank());
  // fp32 messages sum in place in their own chunk (its input is already encoded); others need an
  // fp32 buffer for the sum.
  const bool inPlace = plan.dtype == kFloat32;
  std::vector<float> scratch(inPlace ? 0 : size_t(std::max<int64_t>(own.len, 1)));
  float* sum = inPlace ? static_cast<float*>(data) + own.begin : scratch.data();
  {
    // The reduce phase's buffers die before the gather phase allocates its own, which keeps the
    // peak extra memory near one encoded copy of the message plus one fp32 chunk.
    const int64_t slot = alignUp16(encodedBytes(plan.chunkElems, plan.rs));
    at::Tensor send = byteBuffer(slot * world);
    at::Tensor recv = byteBuffer(slot * world);
    uint8_t* sendBase = send.data_ptr<uint8_t>();
    for (int c = 0; c < world; ++c) {
      const ChunkRange ch = plan.chunk(c);
      encodeBlock(elemPtr(data, plan.dtype, ch.begin), plan.dtype, ch.len, plan.rs,
                  sendBase + c * slot);
    }
    t.allToAll(recv, send, "all-to-all of the reduce phase");
    const uint8_t* recvBase = recv.data_ptr<uint8_t>();
    for (int r = 0; r < world; ++r) {
      decodeBlock(recvBase + r * slot, own.len, plan.rs, sum, /*accumulate=*/r > 0);
    }
  }
  gatherPhase(plan, t, sum, data);
}

}  // namespace qcomm
