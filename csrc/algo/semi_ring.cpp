// semi_ring (EQuARX semi loop): each chunk is reduced from both directions and the two halves meet
// at its owner, so a chunk is requantized about half as often as on the full ring, and both link
// directions carry traffic at once.
//
// Chunk c is owned by rank c. Its right chain is ranks c+R, c+R-1, ..., c+1 (R = floor(W/2)), each
// sending to the rank below it; its left chain is ranks c-L, ..., c-1 (L = floor((W-1)/2)), each
// sending to the rank above. Every rank is on the right chain of one chunk per step and on the left
// chain of another, so at step s (0..R-1) rank r:
//   right: sends chunk (r - R + s) to r-1, receives chunk (r + 1 - R + s) from r+1
//   left (steps s >= R-L only, t = s - (R-L)): sends chunk (r + L - t) to r+1,
//          receives chunk (r - 1 + L - t) from r-1
// A chain starts by encoding the rank's own input; an intermediate rank decodes, adds its local
// chunk (partial = decoded + local) and forwards. The owner finishes at step R-1 with
//   sum = (decoded right + local) + decoded left.
// | W | R | L | hops per chunk (requantizations) |
// | 2 | 1 | 0 | 1 (same as ring)                   |
// | 3 | 1 | 1 | 1 + 1                              |
// | 4 | 2 | 1 | 2 + 1                              |
// | 5 | 2 | 2 | 2 + 2                              |
// Shards pipeline as in the ring (algo_ring.cpp); each shard of the own chunk enters the gather
// phase (gather_pipeline.h) as soon as both halves of it are in.
#include <ATen/ATen.h>

#include "algo/algorithms.h"
#include "algo/gather.h"
#include "codec/codec_cpu.h"

namespace qcomm {

void runSemiRing(const Plan& plan, Transport& t, void* data) {
  const int world = plan.world;
  const int rank = t.rank();
  const int shards = plan.microshards;
  const int rightSteps = world / 2;
  const int leftSteps = (world - 1) / 2;
  const int leftStart = rightSteps - leftSteps;
  const int next = wrapRank(rank + 1, world);
  const int prev = wrapRank(rank - 1, world);
  const int64_t unitBytes = alignUp16(encodedBytes(plan.shardElems, plan.rs));

  // Directions: 0 = right chain (send to prev, receive from next), 1 = left chain (the reverse).
  struct Dir {
    int steps;
    int sendPeer;
    int recvPeer;
  };
  const Dir dirs[2] = {{rightSteps, prev, next}, {leftSteps, next, prev}};
  auto sendChunk = [&](int d, int s) { return semiRingSendChunk(rank, world, d, s); };
  auto recvChunk = [&](int d, int s) { return semiRingRecvChunk(rank, world, d, s); };
  // One unit per (direction, step, shard); tags interleave the two directions.
  const int64_t unitsPerDir = int64_t(rightSteps) * shards;
  auto unit = [&](int d, int s, int k) { return (int64_t(s) * shards + k) * 2 + d; };

  // the gather phase's tags follow the reduce phase's ((s * shards + k) * 2 + d < 2 * W * shards)
  GatherPipeline gather(plan, t, data, 2 * world * shards);
  at::Tensor sendBuf = byteBuffer(unitBytes * unitsPerDir * 2);
  at::Tensor recvBuf = byteBuffer(unitBytes * unitsPerDir * 2);
  std::vector<at::Tensor> recvSlices(size_t(unitsPerDir * 2));
  std::vector<c10::intrusive_ptr<c10d::Work>> recvs(size_t(unitsPerDir * 2));
  std::vector<c10::intrusive_ptr<c10d::Work>> sends;
  std::vector<at::Tensor> sendSlices;

  for (int d = 0; d < 2; ++d) {
    for (int s = 0; s < dirs[d].steps; ++s) {
      for (int k = 0; k < shards; ++k) {
        const ChunkRange sh = plan.shard(recvChunk(d, s), k);
        if (sh.len == 0) continue;
        const int64_t u = unit(d, s, k);
        recvSlices[u] = recvBuf.narrow(0, u * unitBytes, encodedBytes(sh.len, plan.rs));
        recvs[u] = t.irecv(recvSlices[u], dirs[d].recvPeer, int(u));
      }
    }
  }
  auto sendUnit = [&](int d, int s, int k, const void* src, int32_t srcDtype, ChunkRange sh) {
    const int64_t len = sh.len;
    const int64_t u = unit(d, s, k);
    at::Tensor slice = sendBuf.narrow(0, u * unitBytes, encodedBytes(len, plan.rs));
    encodeBlock(src, srcDtype, len, plan.rs, slice.data_ptr<uint8_t>(),
                rsNoise(plan, rank, sh.begin));
    sendSlices.push_back(slice);
    sends.push_back(t.isend(slice, dirs[d].sendPeer, int(u)));
  };
  for (int d = 0; d < 2; ++d) {
    if (dirs[d].steps == 0) continue;
    for (int k = 0; k < shards; ++k) {
      const ChunkRange sh = plan.shard(sendChunk(d, 0), k);
      if (sh.len > 0) sendUnit(d, 0, k, elemPtr(data, plan.dtype, sh.begin), plan.dtype, sh);
    }
  }

  // One fp32 partial per direction; at the last step both hold halves of this rank's own chunk.
  // fp32 messages keep partials in place in the chunk's own elements, decoding with accumulation
  // (x + decoded equals decoded + x bit for bit; a rank adds its input to each chunk once, on one
  // chain only). The owner then accumulates right, then left: (x + right) + left.
  const bool inPlace = plan.dtype == kFloat32;
  std::vector<float> partial[2];
  if (!inPlace) {
    for (auto& p : partial) p.resize(size_t(std::max<int64_t>(plan.chunkElems, 1)));
  }
  // Shard k of this rank's own chunk, once both halves are in: (x + right) + left, then gather.
  auto ownShardDone = [&](int k) {
    const ChunkRange sh = plan.shard(rank, k);
    if (sh.len == 0) return;
    if (inPlace) {
      gather.ownShardReady(k, static_cast<float*>(data) + sh.begin);
      return;
    }
    const int64_t off = sh.begin - plan.chunk(rank).begin;
    float* sum = partial[0].data() + off;
    addToFloat(elemPtr(data, plan.dtype, sh.begin), plan.dtype, sh.len, sum);
    if (leftSteps > 0) {
      for (int64_t i = 0; i < sh.len; ++i) sum[i] = sum[i] + partial[1][size_t(off + i)];
    }
    gather.ownShardReady(k, sum);
  };
  for (int s = 0; s < rightSteps; ++s) {
    for (int k = 0; k < shards; ++k) {
      for (int d = 0; d < 2; ++d) {
        const int ds = d == 0 ? s : s - leftStart;  // this direction's own step number
        if (ds < 0) continue;
        const int c = recvChunk(d, ds);
        const ChunkRange sh = plan.shard(c, k);
        if (sh.len == 0) continue;
        const int64_t u = unit(d, ds, k);
        t.wait(recvs[u], std::string("semi_ring ") + (d == 0 ? "right" : "left") + " step " +
                             std::to_string(ds) + " shard " + std::to_string(k) +
                             " (receive from rank " + std::to_string(dirs[d].recvPeer) + ")");
        const bool owner = ds + 1 == dirs[d].steps;
        if (inPlace) {
          float* p = static_cast<float*>(data) + sh.begin;
          decodeBlock(recvSlices[u].data_ptr<uint8_t>(), sh.len, plan.rs, p, true);
          if (!owner) sendUnit(d, ds + 1, k, p, kFloat32, sh);
          continue;
        }
        float* p = partial[d].data() + (sh.begin - plan.chunk(c).begin);
        decodeBlock(recvSlices[u].data_ptr<uint8_t>(), sh.len, plan.rs, p, false);
        if (owner) continue;  // both halves are combined below, in a fixed order
        addToFloat(elemPtr(data, plan.dtype, sh.begin), plan.dtype, sh.len, p);
        sendUnit(d, ds + 1, k, p, kFloat32, sh);
      }
      if (s + 1 == rightSteps) ownShardDone(k);  // both halves of shard k have arrived
    }
  }
  gather.finish();
  for (auto& w : sends) t.wait(w, "semi_ring reduce-scatter send");
}

}  // namespace qcomm
