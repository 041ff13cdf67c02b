// two_step (Flash Communication): two quantization round trips whatever the world size.
//
// Terms: W ranks, one chunk per rank (chunk c is owned by rank c), each chunk cut into M shards of
// whole groups. A unit is one shard of one chunk.
//   1. reduce phase: every rank encodes each unit of every chunk with the reduce codec and sends
//      unit (c, k) to rank c (peers in rotated order r+1, r+2, ..., so that not every rank sends
//      to rank 0 first); its own units stay local;
//   2. rank c, shard by shard, decodes the W copies of (c, k) to fp32 and sums them in rank order
//      0..W-1 (AVG divides by W), encodes the sum with the gather codec, sends it to every peer,
//      and decodes its own chunk from those same bytes (DESIGN invariant 1);
//   3. gather phase: every rank decodes each received unit into place.
// All receives are posted up front and every unit is sent as soon as it is encoded, so transfers
// overlap the codec: the first sums start while later units are still on the wire, and the
// gather phase's units leave while later sums are computed. Shards are whole groups, so the
// result does not depend on M.
#include <ATen/ATen.h>

#include "algo/algorithms.h"
#include "algo/gather.h"
#include "codec/codec_cpu.h"

namespace qcomm {

void runTwoStep(const Plan& plan, Transport& t, void* data) {
  const int world = plan.world;
  const int rank = t.rank();
  const int shards = plan.microshards;
  const int64_t rsUnit = alignUp16(encodedBytes(plan.shardElems, plan.rs));
  // Per-pair tags: reduce-phase unit k uses tag k, gather-phase unit k uses tag shards + k.
  auto unit = [&](int who, int k) { return int64_t(who) * shards + k; };
  GatherPipeline gather(plan, t, data, shards);

  // rsSend[c][k]: this rank's encoded (c, k); rsRecv[j][k]: rank j's encoded (rank, k).
  at::Tensor rsSend = byteBuffer(rsUnit * world * shards);
  at::Tensor rsRecv = byteBuffer(rsUnit * world * shards);
  uint8_t* rsSendBase = rsSend.data_ptr<uint8_t>();
  uint8_t* rsRecvBase = rsRecv.data_ptr<uint8_t>();
  std::vector<c10::intrusive_ptr<c10d::Work>> rsRecvs(size_t(world * shards));
  std::vector<c10::intrusive_ptr<c10d::Work>> sends;
  std::vector<at::Tensor> inFlight;  // slices referenced by pending works

  auto recvInto = [&](at::Tensor& buf, int64_t offset, int64_t bytes, int peer, int tag) {
    at::Tensor slice = buf.narrow(0, offset, bytes);
    inFlight.push_back(slice);
    return t.irecv(slice, peer, tag);
  };
  auto sendFrom = [&](at::Tensor& buf, int64_t offset, int64_t bytes, int peer, int tag) {
    at::Tensor slice = buf.narrow(0, offset, bytes);
    inFlight.push_back(slice);
    sends.push_back(t.isend(slice, peer, tag));
  };

  for (int k = 0; k < shards; ++k) {
    const ChunkRange mine = plan.shard(rank, k);
    for (int off = 1; off < world; ++off) {
      const int j = (rank + off) % world;
      if (mine.len > 0) {
        rsRecvs[unit(j, k)] =
            recvInto(rsRecv, unit(j, k) * rsUnit, encodedBytes(mine.len, plan.rs), j, k);
      }
    }
  }

  // 1. encode and send, unit by unit
  for (int k = 0; k < shards; ++k) {
    for (int off = 0; off < world; ++off) {
      const int c = (rank + off) % world;
      const ChunkRange sh = plan.shard(c, k);
      if (sh.len == 0) continue;
      encodeBlock(elemPtr(data, plan.dtype, sh.begin), plan.dtype, sh.len, plan.rs,
                  rsSendBase + unit(c, k) * rsUnit, rsNoise(plan, rank, sh.begin));
      if (c != rank) sendFrom(rsSend, unit(c, k) * rsUnit, encodedBytes(sh.len, plan.rs), c, k);
    }
  }

  // 2. sum this rank's chunk shard by shard; fp32 messages sum in place (the input of that shard
  //    is already encoded), others in an fp32 scratch
  const bool inPlace = plan.dtype == kFloat32;
  std::vector<float> sumScratch(inPlace ? 0 : size_t(std::max<int64_t>(plan.shardElems, 1)));
  for (int k = 0; k < shards; ++k) {
    const ChunkRange sh = plan.shard(rank, k);
    if (sh.len == 0) continue;
    float* sum = inPlace ? static_cast<float*>(data) + sh.begin : sumScratch.data();
    for (int j = 0; j < world; ++j) {
      const uint8_t* src = rsSendBase + unit(rank, k) * rsUnit;
      if (j != rank) {
        t.wait(rsRecvs[unit(j, k)], "two_step reduce phase, shard " + std::to_string(k) +
                                        " from rank " + std::to_string(j));
        src = rsRecvBase + unit(j, k) * rsUnit;
      }
      decodeBlock(src, sh.len, plan.rs, sum, /*accumulate=*/j > 0);
    }
    gather.ownShardReady(k, sum);
  }
  // 3. decode every other chunk as its units arrive
  gather.finish();
  for (auto& w : sends) t.wait(w, "two_step send");
}

}  // namespace qcomm
