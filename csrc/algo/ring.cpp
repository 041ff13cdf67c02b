// ring (EQuARX full loop): reduce-scatter in W-1 hops, each hop requantizing the partial sum.
//
// Rank r sends to r+1 and receives from r-1. Chunk c is owned by rank c. At step s (0..W-2):
//   rank r sends chunk (r - s - 1) mod W   and receives chunk (r - s - 2) mod W
//   step 0 sends the rank's own input; the received partial is decoded to fp32, the local input
//   chunk is added (partial = decoded + local), and the result is encoded and sent at step s+1.
//   After step W-2 rank r holds the full sum of chunk r.
// | step | rank 0 sends | rank 1 sends | rank 2 sends |   (W = 3)
// |  0   |   chunk 2    |   chunk 0    |   chunk 1    |
// |  1   |   chunk 1    |   chunk 2    |   chunk 0    |
// Each chunk is cut into microshards; a shard is forwarded as soon as its partial is ready, so the
// transfer of shard k+1 overlaps the decode-add-encode of shard k. Shards are whole groups, so the
// result does not depend on the number of shards. The gather phase (gather_pipeline.h) sends each
// shard of the own chunk as soon as the last step completes it.
#include <ATen/ATen.h>

#include "algo/algorithms.h"
#include "algo/gather.h"
#include "codec/codec_cpu.h"

namespace qcomm {

void runRing(const Plan& plan, Transport& t, void* data) {
  const int world = plan.world;
  const int rank = t.rank();
  const int shards = plan.microshards;
  const int steps = world - 1;
  const int next = wrapRank(rank + 1, world);
  const int prev = wrapRank(rank - 1, world);
  const int64_t unitBytes = alignUp16(encodedBytes(plan.shardElems, plan.rs));
  auto sendChunk = [&](int s) { return wrapRank(rank - s - 1, world); };
  auto recvChunk = [&](int s) { return wrapRank(rank - s - 2, world); };
  auto unit = [&](int s, int k) { return int64_t(s) * shards + k; };

  // the gather phase's tags follow the reduce phase's (s * shards + k < world * shards)
  GatherPipeline gather(plan, t, data, world * shards);
  at::Tensor sendBuf = byteBuffer(unitBytes * steps * shards);
  at::Tensor recvBuf = byteBuffer(unitBytes * steps * shards);
  std::vector<at::Tensor> recvSlices(size_t(steps * shards));
  std::vector<c10::intrusive_ptr<c10d::Work>> recvs(size_t(steps * shards));
  std::vector<c10::intrusive_ptr<c10d::Work>> sends;
  std::vector<at::Tensor> sendSlices;

  // Post every receive up front: the transport fills them as the bytes arrive.
  for (int s = 0; s < steps; ++s) {
    for (int k = 0; k < shards; ++k) {
      const ChunkRange sh = plan.shard(recvChunk(s), k);
      if (sh.len == 0) continue;
      const int64_t u = unit(s, k);
      recvSlices[u] = recvBuf.narrow(0, u * unitBytes, encodedBytes(sh.len, plan.rs));
      recvs[u] = t.irecv(recvSlices[u], prev, int(u));
    }
  }
  auto sendUnit = [&](int s, int k, const void* src, int32_t srcDtype, ChunkRange sh) {
    const int64_t len = sh.len;
    const int64_t u = unit(s, k);
    at::Tensor slice = sendBuf.narrow(0, u * unitBytes, encodedBytes(len, plan.rs));
    encodeBlock(src, srcDtype, len, plan.rs, slice.data_ptr<uint8_t>(),
                rsNoise(plan, rank, sh.begin));
    sendSlices.push_back(slice);
    sends.push_back(t.isend(slice, next, int(u)));
  };
  for (int k = 0; k < shards; ++k) {
    const ChunkRange sh = plan.shard(sendChunk(0), k);
    if (sh.len > 0) sendUnit(0, k, elemPtr(data, plan.dtype, sh.begin), plan.dtype, sh);
  }

  // The partial sum of the chunk being reduced at this step, shard by shard; after the last step,
  // the full sum of this rank's own chunk. fp32 messages keep it in place, in the chunk's own
  // elements (each rank adds its input to a chunk once, so that input is not needed again), and
  // decode with accumulation: x + decoded, bit for bit the decoded + x of the scratch path.
  const bool inPlace = plan.dtype == kFloat32;
  std::vector<float> partial(inPlace ? 0 : size_t(std::max<int64_t>(plan.chunkElems, 1)));
  for (int s = 0; s < steps; ++s) {
    const int c = recvChunk(s);
    const int64_t chunkBegin = plan.chunk(c).begin;
    for (int k = 0; k < shards; ++k) {
      const ChunkRange sh = plan.shard(c, k);
      if (sh.len == 0) continue;
      const int64_t u = unit(s, k);
      t.wait(recvs[u], "ring reduce-scatter step " + std::to_string(s) + " shard " +
                           std::to_string(k) + " (receive from rank " + std::to_string(prev) + ")");
      float* p =
          inPlace ? static_cast<float*>(data) + sh.begin : partial.data() + (sh.begin - chunkBegin);
      if (inPlace) {
        decodeBlock(recvSlices[u].data_ptr<uint8_t>(), sh.len, plan.rs, p, true);
      } else {
        decodeBlock(recvSlices[u].data_ptr<uint8_t>(), sh.len, plan.rs, p, false);
        addToFloat(elemPtr(data, plan.dtype, sh.begin), plan.dtype, sh.len, p);
      }
      if (s + 1 < steps) {
        sendUnit(s + 1, k, p, kFloat32, sh);
      } else {
        gather.ownShardReady(k, p);  // the last step completes this rank's own chunk
      }
    }
  }
  for (size_t i = 0; i < sends.size(); ++i) {
    t.wait(sends[i], "ring reduce-scatter send to rank " + std::to_string(next));
  }
  gather.finish();
}

}  // namespace qcomm
