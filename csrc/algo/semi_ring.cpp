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
// Each step of each piece is one exchange of both directions' legs (over a stream-ordered
// transport one batch, so both link directions run at once); pieces pipeline as in the ring
// (ring.cpp), and each piece of the own chunk enters the gather phase (schedule.h) as soon as both
// halves of it are in.
#include "algo/schedule.h"

namespace qcomm {
namespace algo {
namespace {

// The chunk `rank` sends, and the chunk it receives, at its own step s of direction d (0: the
// right chain, R = W / 2 steps; 1: the left chain, L = (W - 1) / 2 steps).
int sendChunk(int rank, int W, int d, int s) {
  return d == 0 ? wrapRank(rank - W / 2 + s, W) : wrapRank(rank + (W - 1) / 2 - s, W);
}
int recvChunk(int rank, int W, int d, int s) {
  return sendChunk(wrapRank(rank + (d == 0 ? 1 : -1), W), W, d, s);
}

}  // namespace

void semiRing(Call& c) {
  const Plan& p = c.plan;
  const int W = c.world, P = c.pieces, rank = c.rank;
  const int right = W / 2, left = (W - 1) / 2, leftStart = right - left;
  const int next = wrapRank(rank + 1, W), prev = wrapRank(rank - 1, W);
  const int64_t rsUnit = c.unit(p.rs), agUnit = c.gatherUnit();
  // Directions: 0 = right chain (send to prev, receive from next), 1 = left chain (the reverse).
  struct Dir {
    int steps;
    int start;  // the step of this direction's first hop
    int sendPeer;
    int recvPeer;
  };
  const Dir dirs[2] = {{right, 0, prev, next}, {left, leftStart, next, prev}};
  // a unit per (direction, step, piece) where receives are posted early, else one per direction;
  // tags interleave the two directions
  const bool early = c.t.overlapsCodec();
  auto unit = [&](int d, int ds, int k) { return (int64_t(ds) * P + k) * 2 + d; };
  auto slot = [&](int d, int ds, int k) { return early ? unit(d, ds, k) : d; };
  const int64_t units = early ? int64_t(right) * P * 2 : 2;
  at::Tensor sendBuf = c.byteBuffer(right > 0 ? rsUnit * units : 0);
  at::Tensor recvBuf = c.byteBuffer(right > 0 ? rsUnit * units : 0);
  const bool inMessage = c.gatherInMessage();  // the gather phase needs no buffers
  at::Tensor agSend = c.byteBuffer(inMessage ? 0 : agUnit * P);
  at::Tensor agRecv = c.byteBuffer(inMessage ? 0 : agUnit * W * P);
  at::Tensor scratch = c.floatBuffer(c.inPlace() ? 0 : c.pieceElems);
  float* partialScratch = scratch.data_ptr<float>();

  // the gather phase's tags follow the reduce phase's ((s * P + k) * 2 + d < 2 * W * P)
  auto gather = ownChunkSink(c, agSend, agRecv, partialScratch, 2 * W * P);
  // hop[s][k]: the exchange of global step s, piece k; leg 2 * i sends and 2 * i + 1 receives for
  // the i-th direction active at that step (the right chain, then the left from leftStart on)
  std::vector<int> hop(size_t(right) * P);
  for (int s = 0; s < right; ++s) {
    for (int k = 0; k < P; ++k) {
      std::vector<Exchange::Leg> legs;
      for (int d = 0; d < 2; ++d) {
        const int ds = s - dirs[d].start;
        if (ds < 0) continue;
        const int tag = int(unit(d, ds, k));
        const int64_t at = slot(d, ds, k) * rsUnit;
        legs.push_back({true, dirs[d].sendPeer, tag, sendBuf.narrow(0, at, rsUnit),
                        encodedBytes(c.piece(sendChunk(rank, W, d, ds), k).len, p.rs)});
        legs.push_back({false, dirs[d].recvPeer, tag, recvBuf.narrow(0, at, rsUnit),
                        encodedBytes(c.piece(recvChunk(rank, W, d, ds), k).len, p.rs)});
      }
      hop[size_t(s) * P + k] = c.t.post(Exchange::ofLegs(
          "semi_ring reduce-scatter step " + std::to_string(s) + " shard " + std::to_string(k),
          std::move(legs)));
    }
  }
  // the index of direction d's send leg in the exchange of global step s (its receive: + 1)
  auto legIndex = [&](int d, int s) { return d == 1 && s >= leftStart ? 2 : 0; };
  auto exchangeOf = [&](int d, int ds, int k) { return hop[size_t(ds + dirs[d].start) * P + k]; };

  if (right == 0) {  // a world of one: the sum is the input
    return gather->fromInput();
  }

  c.step = "semi_ring reduce-scatter (encode)";
  for (int d = 0; d < 2; ++d) {
    if (dirs[d].steps == 0) continue;
    for (int k = 0; k < P; ++k) {
      const ChunkRange piece = c.piece(sendChunk(rank, W, d, 0), k);
      if (piece.len > 0) {
        c.encodeInput(piece.begin, piece.len, Call::at(sendBuf, slot(d, 0, k) * rsUnit),
                      rsNoise(p, rank, piece.begin));
      }
      c.t.ready(exchangeOf(d, 0, k), legIndex(d, dirs[d].start));
    }
  }
  // Intermediate ranks forward decoded + local (in place for fp32). The owner sums in `sum` (its
  // chunk's elements for fp32, else the scratch): right + local, then + left, in that order.
  for (int s = 0; s < right; ++s) {
    for (int k = 0; k < P; ++k) {
      for (int d = 0; d < 2; ++d) {
        const int ds = s - dirs[d].start;  // this direction's own step
        if (ds < 0) continue;
        const ChunkRange piece = c.piece(recvChunk(rank, W, d, ds), k);
        const uint8_t* got = c.t.wait(exchangeOf(d, ds, k), legIndex(d, s) + 1);
        float* partial = c.inPlace() ? c.inputFloats(piece.begin) : partialScratch;
        // the owner adds its local input once, to the right half (d == 0)
        int32_t localDtype = p.dtype;
        const bool addsLocal = piece.len > 0 && (ds + 1 < dirs[d].steps || d == 0);
        const void* local = addsLocal ? c.localForHop(piece, partial, &localDtype) : nullptr;
        if (ds + 1 < dirs[d].steps) {
          c.step = "semi_ring reduce-scatter (decode, add, encode)";
          if (piece.len > 0) {
            c.ops.decodeAddEncode(got, p.rs, local, localDtype, piece.len, partial, p.rs,
                                  Call::at(sendBuf, slot(d, ds + 1, k) * rsUnit),
                                  rsNoise(p, rank, piece.begin));
          }
          c.t.ready(exchangeOf(d, ds + 1, k), legIndex(d, s + 1));
        } else if (piece.len > 0) {
          // the owner: the right half plus the local input, then the left half added to it
          c.step = "semi_ring reduce-scatter (owner's sum)";
          if (d == 0) {
            c.ops.decodeAdd(got, p.rs, local, localDtype, piece.len, partial);
          } else {
            c.ops.decode(got, piece.len, p.rs, partial, true);
          }
        }
      }
      if (s + 1 == right) {  // both halves of piece k are in
        const ChunkRange own = c.piece(rank, k);
        gather->ownPieceReady(k, c.inPlace() ? c.inputFloats(own.begin) : partialScratch);
      }
    }
  }
  gather->finish();
}

}  // namespace algo
}  // namespace qcomm
