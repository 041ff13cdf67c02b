// two_step (Flash Communication): two quantization round trips whatever the world size.
//
// Terms: W ranks, one chunk per rank (chunk c is owned by rank c), each chunk cut into P pieces of
// whole groups (the plan's microshards where the transport overlaps transfers with the codec,
// else 1). A unit is one piece of one chunk.
//   1. reduce phase: every rank encodes each unit (c, k) of every chunk with the reduce codec and
//      sends it to rank c (peers in rotated order r+1, r+2, ..., so that not every rank sends to
//      rank 0 first); its own units stay local. Piece k of all chunks is one all-to-all;
//   2. rank c, piece by piece, decodes the W copies of (c, k) to fp32 and sums them in rank order
//      0..W-1; the sum enters the gather phase (schedule.h): AVG divides by W, the gather codec
//      encodes it, every rank receives those bytes and decodes them into place, the owner too
//      (DESIGN invariant 1);
//   3. every rank decodes each received unit of the gather phase into place.
// Every exchange is declared before the first encode, and every unit is sent as soon as it is
// encoded, so over Gloo the first sums start while later units are still on the wire, and the
// gather phase's units leave while later sums are computed. fp32 messages sum in place (the input
// of that piece is already encoded), others in an fp32 scratch of one piece.
// Over a transport that overlaps the codec (host memory over Gloo, point to point) a rank's own
// units never travel, so they are not kept in the send buffer: each is encoded into one unit of
// its own just before its sum (the same bytes, noise included), which spares 1/W of the send
// buffer (at W = 2 a quarter of a 16-bit message). Stream-ordered transports move the own slot
// with the rest in one collective and reuse the send buffer for the gather phase: as before.
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
  const bool ownApart = !reuse;
  at::Tensor ownUnit = c.byteBuffer(ownApart ? rsUnit : 0);

  auto gather = ownChunkSink(c, agSend, agRecv, scratch.data_ptr<float>(), P);
  std::vector<int> reduce;
  for (int k = 0; k < P; ++k) {
    reduce.push_back(c.t.post(Exchange::slots(
        Exchange::kAllToAll, "two_step reduce phase, shard " + std::to_string(k), k,
        rsSend.narrow(0, k * W * rsUnit, W * rsUnit), rsRecv.narrow(0, k * W * rsUnit, W * rsUnit),
        rsUnit, c.pieceBytes(k, p.rs))));
  }

  // 1. encode and send, unit by unit
  c.step = "two_step reduce phase (encode)";
  for (int k = 0; k < P; ++k) {
    for (int off = 0; off < W; ++off) {
      const int j = (rank + off) % W;
      const ChunkRange unit = c.piece(j, k);
      if (unit.len > 0 && !(ownApart && j == rank)) {
        c.encodeInput(unit.begin, unit.len, Call::at(rsSend, (int64_t(k) * W + j) * rsUnit),
                      rsNoise(p, rank, unit.begin));
      }
      c.t.ready(reduce[size_t(k)], j);
    }
  }

  // 2. sum this rank's chunk piece by piece, each copy as it arrives
  for (int k = 0; k < P; ++k) {
    const ChunkRange own = c.piece(rank, k);
    float* sum = c.inPlace() ? c.inputFloats(own.begin) : scratch.data_ptr<float>();
    if (ownApart && own.len > 0) {  // before the sum: an fp32 sum overwrites this input
      c.step = "two_step reduce phase (encode)";
      c.encodeInput(own.begin, own.len, Call::at(ownUnit, 0), rsNoise(p, rank, own.begin));
    }
    auto copy = [&](int j) {
      const uint8_t* got = c.t.wait(reduce[size_t(k)], j);
      return ownApart && j == rank ? Call::at(ownUnit, 0) : got;
    };
    c.step = "two_step reduce phase (sum)";
    if (own.len > 0) {
      c.ops.decodeSum(copy, W, own.len, p.rs, sum);
    } else {
      for (int j = 0; j < W; ++j) copy(j);  // nothing to sum; the exchange still completes
    }
    gather->ownPieceReady(k, sum);
  }
  // 3. decode every other chunk as its units arrive
  gather->finish();
}

}  // namespace algo
}  // namespace qcomm
