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
// Each chunk is cut into P pieces (schedule.h); a piece is forwarded as soon as its partial is
// ready, so over Gloo the transfer of piece k+1 overlaps the decode-add-encode of piece k; over a
// stream-ordered transport each hop is one batch of a send and a receive. Pieces are whole groups,
// so the result does not depend on P. The gather phase (schedule.h) takes each piece of the own
// chunk as soon as the last step completes it.
#include "algo/schedule.h"

namespace qcomm {
namespace algo {

void ring(Call& c) {
  const Plan& p = c.plan;
  const int W = c.world, P = c.pieces, rank = c.rank;
  const int steps = W - 1;
  const int next = wrapRank(rank + 1, W), prev = wrapRank(rank - 1, W);
  auto sendChunk = [&](int s) { return wrapRank(rank - s - 1, W); };
  auto recvChunk = [&](int s) { return wrapRank(rank - s - 2, W); };
  const int64_t rsUnit = c.unit(p.rs), agUnit = c.gatherUnit();
  // a unit per (step, piece) where receives are posted early; else one, reused hop after hop
  const bool early = c.t.overlapsCodec();
  auto slot = [&](int s, int k) { return early ? int64_t(s) * P + k : 0; };
  const int64_t units = early ? int64_t(steps) * P : 1;
  at::Tensor sendBuf = c.byteBuffer(steps > 0 ? rsUnit * units : 0);
  at::Tensor recvBuf = c.byteBuffer(steps > 0 ? rsUnit * units : 0);
  const bool inMessage = c.gatherInMessage();  // the gather phase needs no buffers
  at::Tensor agSend = c.byteBuffer(inMessage ? 0 : agUnit * P);
  at::Tensor agRecv = c.byteBuffer(inMessage ? 0 : agUnit * W * P);
  at::Tensor scratch = c.floatBuffer(c.inPlace() ? 0 : c.pieceElems);
  float* partialScratch = scratch.data_ptr<float>();

  // the gather phase's tags follow the reduce phase's (s * P + k < W * P)
  auto gather = ownChunkSink(c, agSend, agRecv, partialScratch, W * P);
  std::vector<int> hop(size_t(steps) * P);
  for (int s = 0; s < steps; ++s) {
    for (int k = 0; k < P; ++k) {
      const int tag = s * P + k;
      const int64_t out = encodedBytes(c.piece(sendChunk(s), k).len, p.rs);
      const int64_t in = encodedBytes(c.piece(recvChunk(s), k).len, p.rs);
      hop[size_t(s) * P + k] = c.t.post(Exchange::ofLegs(
          "ring reduce-scatter step " + std::to_string(s) + " shard " + std::to_string(k),
          {{true, next, tag, sendBuf.narrow(0, slot(s, k) * rsUnit, rsUnit), out},
           {false, prev, tag, recvBuf.narrow(0, slot(s, k) * rsUnit, rsUnit), in}}));
    }
  }
  auto sent = [&](int s, int k) { c.t.ready(hop[size_t(s) * P + k], 0); };

  if (steps == 0) {  // a world of one: the sum is the input
    return gather->fromInput();
  }

  c.step = "ring reduce-scatter (encode)";
  for (int k = 0; k < P; ++k) {
    const ChunkRange piece = c.piece(sendChunk(0), k);
    if (piece.len > 0) {
      c.encodeInput(piece.begin, piece.len, Call::at(sendBuf, slot(0, k) * rsUnit),
                    rsNoise(p, rank, piece.begin));
    }
    sent(0, k);
  }
  // The partial sum of the chunk received at this step, piece by piece (in place for fp32): after
  // the last step, the full sum of this rank's own chunk.
  for (int s = 0; s < steps; ++s) {
    const int chunk = recvChunk(s);
    for (int k = 0; k < P; ++k) {
      const ChunkRange piece = c.piece(chunk, k);
      const uint8_t* got = c.t.wait(hop[size_t(s) * P + k], 1);
      float* partial = c.inPlace() ? c.inputFloats(piece.begin) : partialScratch;
      int32_t localDtype = p.dtype;
      const void* local = piece.len > 0 ? c.localForHop(piece, partial, &localDtype) : nullptr;
      if (s + 1 < steps) {
        c.step = "ring reduce-scatter (decode, add, encode)";
        if (piece.len > 0) {
          c.ops.decodeAddEncode(got, p.rs, local, localDtype, piece.len, partial, p.rs,
                                Call::at(sendBuf, slot(s + 1, k) * rsUnit),
                                rsNoise(p, rank, piece.begin));
        }
        sent(s + 1, k);
      } else {
        c.step = "ring reduce-scatter (decode, add)";
        if (piece.len > 0) c.ops.decodeAdd(got, p.rs, local, localDtype, piece.len, partial);
        gather->ownPieceReady(k, partial);  // the last step completes this rank's own chunk
      }
    }
  }
  gather->finish();
}

}  // namespace algo
}  // namespace qcomm
