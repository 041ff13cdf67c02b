// The gather phase shared by two_step, ring and semi_ring (schedule.h, GatherPhase).
#include "algo/schedule.h"

namespace qcomm {
namespace algo {

GatherPhase::GatherPhase(Call& c, at::Tensor send, at::Tensor recv, float* scratch, int tagBase)
    : c_(c), send_(std::move(send)), recv_(std::move(recv)), scratch_(scratch) {
  unit_ = c.unit(c.plan.ag);
  const int64_t w = c.world;
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
    c_.ops.decode(bytes, range.len, c_.plan.ag, c_.inputFloats(range.begin), false);
    return;
  }
  c_.ops.decode(bytes, range.len, c_.plan.ag, scratch_, false);
  c_.ops.castFromFloat(scratch_, range.len, c_.plan.dtype, c_.input(range.begin));
}

void GatherPhase::ownPieceReady(int k, float* sum) {
  const ChunkRange own = c_.piece(c_.rank, k);
  uint8_t* enc = Call::at(send_, k * unit_);
  c_.step = "gather phase (encode)";
  if (own.len > 0) {
    if (c_.plan.average) c_.ops.divide(sum, own.len, c_.world);
    c_.ops.encode(sum, kFloat32, own.len, c_.plan.ag, enc, agNoise(c_.plan, c_.rank, own.begin));
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
      decodeToOutput(c_.t.wait(ids_[size_t(k)], j), range);
    }
  }
}

void GatherPhase::fromInput() {
  for (int k = 0; k < c_.pieces; ++k) {
    const ChunkRange own = c_.piece(c_.rank, k);
    float* sum = c_.inPlace() ? c_.inputFloats(own.begin) : scratch_;
    if (!c_.inPlace() && own.len > 0) {
      c_.ops.castToFloat(c_.input(own.begin), c_.plan.dtype, own.len, sum);
    }
    ownPieceReady(k, sum);
  }
  finish();
}

}  // namespace algo
}  // namespace qcomm
