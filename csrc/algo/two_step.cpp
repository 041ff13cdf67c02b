// two_step (Flash Communication): two quantization round trips whatever the world size.
//
// Terms: W ranks, one chunk per rank (chunk c is owned by rank c), each chunk cut into P pieces of
// whole groups (the plan's microshards where the transport overlaps transfers with the codec,
// else 1). A unit is one piece of one chunk.
//   1. reduce phase: every rank encodes each unit (c, k) of every other rank's chunk with the
//      reduce codec and sends it to rank c (peers in rotated order r+1, r+2, ..., so that not
//      every rank sends to rank 0 first). Piece k of all chunks is one all-to-all; a rank's own
//      slot in it is never written (its own units do not travel: see 2);
//   2. rank c, piece by piece, sums its own values of (c, k), exact (in fp32: the input, cast or
//      rotated), and then the decoded copies of the W - 1 others in rank order, skipping its own;
//      the sum enters the gather phase (schedule.h): AVG divides by W, the gather codec encodes
//      it, every rank receives those bytes and decodes them into place, the owner too (DESIGN
//      invariant 1);
//   3. every rank decodes each received unit of the gather phase into place.
// The owner's own values are summed as they are, not as a decoded copy of their own encoding
// (Flash Communication's all-to-all quantizes every slot, its own included): a rank quantizes
// (W - 1)/W of its input in the reduce phase instead of all of it, and the sum holds one
// quantization error fewer (tests: qcomm/reference.py's two_step).
// Every exchange is declared before the first encode, and every unit is sent as soon as it is
// encoded, so over Gloo the first sums start while later units are still on the wire, and the
// gather phase's units leave while later sums are computed. fp32 messages sum in place (the own
// values are the input itself), others in an fp32 scratch of one piece. Stream-ordered
// transports (NCCL, CUDA IPC) move the reduce phase in one collective and reuse its buffers for
// the gather phase.
#include "algo/schedule.h"

namespace qcomm {
namespace algo {

void twoStep(Call& c) {
  const Plan& p = c.plan;
  const int W = c.world, P = c.pieces, rank = c.rank;
  const int64_t rsUnit = c.unit(p.rs), agUnit = c.gatherUnit();
  // Buffers, all allocated before the first exchange. rsSend/rsRecv: [piece k][rank] units of the
  // reduce codec. A stream-ordered transport has finished an exchange once it has been waited for,
  // so the gather phase reuses them; elsewhere it has its own.
  const bool reuse = !c.t.overlapsCodec();
  const bool inMessage = c.gatherInMessage();  // the gather phase needs no buffers
  at::Tensor rsSend = c.byteBuffer(std::max(rsUnit * W * P, reuse ? agUnit : 0));
  at::Tensor rsRecv = c.byteBuffer(std::max(rsUnit * W * P, reuse ? agUnit * W : 0));
  at::Tensor agSend = reuse ? rsSend : c.byteBuffer(inMessage ? 0 : agUnit * P);
  at::Tensor agRecv = reuse ? rsRecv : c.byteBuffer(inMessage ? 0 : agUnit * W * P);
  at::Tensor scratch = c.floatBuffer(c.inPlace() ? 0 : c.pieceElems);

  auto gather = ownChunkSink(c, agSend, agRecv, scratch.data_ptr<float>(), P);
  std::vector<int> reduce;
  for (int k = 0; k < P; ++k) {
    reduce.push_back(c.t.post(Exchange::slots(
        Exchange::kAllToAll, "two_step reduce phase, shard " + std::to_string(k), k,
        rsSend.narrow(0, k * W * rsUnit, W * rsUnit), rsRecv.narrow(0, k * W * rsUnit, W * rsUnit),
        rsUnit, c.pieceBytes(k, p.rs))));
  }

  // 1. encode and send, unit by unit (the own slot is declared ready unwritten: it never travels)
  c.step = "two_step reduce phase (encode)";
  for (int k = 0; k < P; ++k) {
    for (int off = 0; off < W; ++off) {
      const int j = (rank + off) % W;
      const ChunkRange unit = c.piece(j, k);
      if (unit.len > 0 && j != rank) {
        c.encodeInput(unit.begin, unit.len, Call::at(rsSend, (int64_t(k) * W + j) * rsUnit),
                      rsNoise(p, rank, unit.begin));
      }
      c.t.ready(reduce[size_t(k)], j);
    }
  }

  // 2. sum this rank's chunk piece by piece: its own values, then every other copy as it arrives
  for (int k = 0; k < P; ++k) {
    const ChunkRange own = c.piece(rank, k);
    float* sum = c.inPlace() ? c.inputFloats(own.begin) : scratch.data_ptr<float>();
    c.step = "two_step reduce phase (sum)";
    c.ownToFloat(own, sum);
    // copy i of the W - 1 others: rank i below this one, i + 1 above
    auto copy = [&](int i) { return c.t.wait(reduce[size_t(k)], i < rank ? i : i + 1); };
    if (own.len > 0) {
      c.ops.decodeSum(copy, W - 1, own.len, p.rs, sum, /*accumulate=*/true);
    } else {
      for (int i = 0; i < W - 1; ++i) copy(i);  // nothing to sum; the exchange still completes
    }
    gather->ownPieceReady(k, sum);
  }
  // 3. decode every other chunk as its units arrive
  gather->finish();
}

}  // namespace algo
}  // namespace qcomm
