// Plan selection: eligibility, algorithm choice for `auto`, codecs and chunk geometry.
#include "plan.h"

#include <algorithm>

namespace qcomm {
namespace {

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

ChunkRange Plan::chunk(int c) const {
  const int64_t begin = std::min<int64_t>(int64_t(c) * chunkElems, numel);
  return {begin, std::min<int64_t>(chunkElems, numel - begin)};
}

ChunkRange Plan::shard(int c, int k) const {
  const ChunkRange ch = chunk(c);
  const int64_t off = std::min<int64_t>(int64_t(k) * shardElems, ch.len);
  return {ch.begin + off, std::min<int64_t>(shardElems, ch.len - off)};
}

Plan makePlan(const CallFacts& f, const QuantConfig& cfg) {
  Plan p;
  p.world = f.world;
  p.numel = f.numel;
  p.dtype = f.dtype;
  p.average = f.opAvg;
  auto passThrough = [&](const char* why) {
    p.quantize = false;
    p.reason = why;
    return p;
  };
  if (cfg.algorithm == kAlgoNone) return passThrough("algorithm is none");
  if (cfg.rsBits == 0 && cfg.agBits == 0) return passThrough("both phases are none");
  if (f.world < 2) return passThrough("world size 1");
  if (f.sparseOrComplex) return passThrough("sparse or complex tensor");
  if (f.dtype < 0) return passThrough("dtype is not fp32, fp16 or bf16");
  if (!f.opSum && !f.opAvg) return passThrough("op is not SUM or AVG");
  if (f.numel == 0) return passThrough("empty tensor");
  if (f.numel * dtypeBytes(f.dtype) < cfg.minBytes) return passThrough("message below min_bytes");

  p.quantize = true;
  // auto: two_step. It has the fewest quantization round trips (two, whatever the world size), so
  // the lowest error, and it needs two collectives where the rings need W-1 hops. The measured
  // crossovers that refine this live in benchmarks/RESULTS.md.
  p.algorithm = cfg.algorithm == kAuto ? kTwoStep : cfg.algorithm;
  p.rs = CodecSpec{cfg.rsBits, cfg.groupSize, cfg.symmetric ? 1 : 0, f.dtype};
  p.ag = CodecSpec{cfg.agBits, cfg.groupSize, cfg.symmetric ? 1 : 0, f.dtype};
  const int64_t g = cfg.groupSize;
  p.chunkElems = ceilDiv(ceilDiv(f.numel, g), f.world) * g;
  p.microshards = p.algorithm == kTwoStep ? 1 : std::max(1, cfg.microshards);
  p.shardElems = ceilDiv(ceilDiv(p.chunkElems, g), p.microshards) * g;
  return p;
}

}  // namespace qcomm
