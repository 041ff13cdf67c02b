// The gather phase shared by two_step, ring and semi_ring (schedule.h, GatherPhase), the
// all-gather that is that phase alone, and the reduce-scatter's end (ShardOutput).
#include <algorithm>

#include "algo/schedule.h"

namespace qcomm {
namespace algo {

GatherPhase::GatherPhase(Call& c, at::Tensor send, at::Tensor recv, float* scratch, int tagBase)
    : c_(c),
      inMessage_(c.gatherInMessage()),
      send_(std::move(send)),
      recv_(std::move(recv)),
      scratch_(scratch) {
  unit_ = c.unit(c.plan.ag);
  const int64_t w = c.world;
  if (inMessage_) {
    // legs 2(off-1) and 2(off-1)+1: the send to and the receive from rank + off, in the order
    // the all-gather below posts and sends them (the same messages on the wire)
    for (int k = 0; k < c.pieces; ++k) {
      const ChunkRange own = c.piece(c.rank, k);
      std::vector<Exchange::Leg> legs;
      for (int off = 1; off < c.world; ++off) {
        const int j = (c.rank + off) % c.world;
        const ChunkRange peer = c.piece(j, k);
        legs.push_back(
            {true, j, tagBase + k, c.messageBytes(own), encodedBytes(own.len, c.plan.ag)});
        legs.push_back(
            {false, j, tagBase + k, c.messageBytes(peer), encodedBytes(peer.len, c.plan.ag)});
      }
      ids_.push_back(
          c.t.post(Exchange::ofLegs("gather phase, shard " + std::to_string(k), std::move(legs))));
    }
    return;
  }
  for (int k = 0; k < c.pieces; ++k) {
    ids_.push_back(c.t.post(Exchange::slots(
        Exchange::kAllGather, "gather phase, shard " + std::to_string(k), tagBase + k,
        send_.narrow(0, k * unit_, unit_), recv_.narrow(0, k * w * unit_, w * unit_), unit_,
        c.pieceBytes(k, c.plan.ag))));
  }
}

void GatherPhase::decodeToOutput(const uint8_t* bytes, ChunkRange range) {
  if (range.len == 0) return;
  if (c_.inPlace()) {
    c_.decodeOutput(bytes, range.len, c_.inputFloats(range.begin), true);
    return;
  }
  c_.decodeOutput(bytes, range.len, scratch_, false);
  c_.ops.castFromFloat(scratch_, range.len, c_.plan.dtype, c_.input(range.begin));
}

void GatherPhase::ownPieceReady(int k, float* sum) {
  const ChunkRange own = c_.piece(c_.rank, k);
  // in the message: this piece's elements were read for the last time by the reduce phase
  uint8_t* enc =
      inMessage_ ? static_cast<uint8_t*>(c_.input(own.begin)) : Call::at(send_, k * unit_);
  c_.step = "gather phase (encode)";
  if (own.len > 0) {
    if (c_.plan.average) c_.ops.divide(sum, own.len, c_.world);
    c_.ops.encode(sum, kFloat32, own.len, c_.plan.ag, enc, agNoise(c_.plan, c_.rank, own.begin));
  }
  if (inMessage_) {
    for (int off = 1; off < c_.world; ++off) c_.t.ready(ids_[size_t(k)], 2 * (off - 1));
    return;  // decoded by finish(), once the sends have left
  }
  c_.t.ready(ids_[size_t(k)], c_.rank);
  c_.step = "gather phase (decode)";
  decodeToOutput(enc, own);
}

void GatherPhase::finish() {
  c_.step = "gather phase (decode)";
  for (int k = 0; k < c_.pieces; ++k) {
    for (int off = 1; off < c_.world; ++off) {
      const int j = (c_.rank + off) % c_.world;
      const ChunkRange range = c_.piece(j, k);
      if (range.len == 0) continue;
      // in the message: decoded whole into the scratch before the cast overwrites the bytes
      decodeToOutput(c_.t.wait(ids_[size_t(k)], inMessage_ ? 2 * (off - 1) + 1 : j), range);
    }
  }
  if (!inMessage_) return;
  c_.t.finish();  // this rank's pieces have reached every peer: their bytes may be overwritten
  for (int k = 0; k < c_.pieces; ++k) {
    const ChunkRange own = c_.piece(c_.rank, k);
    decodeToOutput(static_cast<const uint8_t*>(c_.input(own.begin)), own);
  }
}

void GatherPhase::fromInput() {
  for (int k = 0; k < c_.pieces; ++k) {
    const ChunkRange own = c_.piece(c_.rank, k);
    float* sum = c_.inPlace() ? c_.inputFloats(own.begin) : scratch_;
    c_.ownToFloat(own, sum);
    ownPieceReady(k, sum);
  }
  finish();
}

void ShardOutput::ownPieceReady(int k, float* sum) {
  const ChunkRange own = c_.piece(c_.rank, k);
  // where the piece lies in the output: a rotated plan's chunk is the shard padded to whole
  // groups, and the padding is not written
  const int64_t at = own.begin - c_.plan.chunk(c_.rank).begin;
  const int64_t len = std::min<int64_t>(own.len, std::max<int64_t>(0, c_.plan.userRowElems() - at));
  if (len == 0) return;
  c_.step = "reduce-scatter (scale, write the output)";
  if (c_.plan.average) c_.ops.divide(sum, own.len, c_.world);
  if (c_.plan.premul) c_.ops.multiply(sum, own.len, c_.plan.factor);
  if (c_.plan.rotate) {
    // the sum is in the rotated domain: H y / g per group (whole groups: the piece's length is),
    // the bits of codec.h unrotateGroupInto (1/g is a power of two)
    const int g = c_.plan.rs.groupSize;
    c_.ops.rotateToFloat(sum, kFloat32, own.len, g, sum);
    c_.ops.multiply(sum, own.len, 1.0f / float(g));
  }
  uint8_t* dst = static_cast<uint8_t*>(c_.out->data_ptr()) + at * dtypeBytes(c_.plan.dtype);
  c_.ops.castFromFloat(sum, len, c_.plan.dtype, dst);
}

void ShardOutput::fromInput() {
  at::Tensor scratch = c_.floatBuffer(c_.pieceElems);
  float* sum = scratch.data_ptr<float>();
  for (int k = 0; k < c_.pieces; ++k) {
    const ChunkRange own = c_.piece(c_.rank, k);
    if (own.len > 0 && c_.plan.rotate) {
      c_.ops.rotateToFloat(c_.input(own.begin), c_.plan.dtype, own.len, c_.plan.rs.groupSize, sum);
    } else if (own.len > 0) {
      c_.ops.castToFloat(c_.input(own.begin), c_.plan.dtype, own.len, sum);
    }
    ownPieceReady(k, sum);
  }
}

std::unique_ptr<OwnChunk> ownChunkSink(Call& c, at::Tensor send, at::Tensor recv, float* scratch,
                                       int tagBase) {
  if (!c.gathers()) return std::make_unique<ShardOutput>(c);
  return std::make_unique<GatherPhase>(c, std::move(send), std::move(recv), scratch, tagBase);
}

void allGather(Call& c) {
  const int64_t unit = c.gatherUnit();
  const bool inMessage = c.gatherInMessage();  // the gather phase needs no buffers
  at::Tensor send = c.byteBuffer(inMessage ? 0 : unit * c.pieces);
  at::Tensor recv = c.byteBuffer(inMessage ? 0 : unit * c.world * c.pieces);
  at::Tensor scratch = c.floatBuffer(c.inPlace() ? 0 : c.pieceElems);
  GatherPhase gather(c, send, recv, scratch.data_ptr<float>(), 0);
  gather.fromInput();
}

}  // namespace algo
}  // namespace qcomm
