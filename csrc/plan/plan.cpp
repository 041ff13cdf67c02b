// Plan selection: eligibility, algorithm choice for `auto`, codecs and chunk geometry.
#include "plan/plan.h"

#include <algorithm>

namespace qcomm {
namespace {

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A plan holding the call's facts only (what a pass-through plan reports).
Plan factsOnly(const CallFacts& f) {
  Plan p;
  p.world = f.world;
  p.numel = f.numel;
  p.dtype = f.dtype;
  p.average = f.opAvg;
  return p;
}

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

Plan makePlan(const CallFacts& f, const QuantConfig& cfg, const TuningTable* table) {
  Plan p = factsOnly(f);
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
  const int64_t bytes = f.numel * dtypeBytes(f.dtype);
  if (bytes < cfg.minBytes) return passThrough("message below min_bytes");
  if (cfg.algorithm != kAuto || table == nullptr) return quantizedPlan(f, cfg);
  const TuneEntry* e = table->find(f.dtype, sizeClassOf(bytes));
  if (e == nullptr) {
    Plan q = quantizedPlan(f, cfg);
    q.tuneNeeded = cfg.tune;
    return q;
  }
  if (e->choice.exact()) return passThrough("tuned: the exact allreduce measured faster here");
  QuantConfig chosen = cfg;
  chosen.algorithm = e->choice.algorithm;
  chosen.microshards = e->choice.microshards;
  Plan q = quantizedPlan(f, chosen);
  q.tuned = true;
  return q;
}

Plan quantizedPlan(const CallFacts& f, const QuantConfig& cfg) {
  Plan p = factsOnly(f);
  p.quantize = true;
  p.userNumel = f.numel;
  p.stochastic = cfg.stochasticRounding;
  p.shadow = cfg.shadow;
  p.userDtype = f.dtype;
  if (rotates(cfg)) {
    // whole groups (the caller's tensor padded with zeros where it ends inside one); the codec
    // rotates each group as it encodes and decodes, and a phase set to none ships the rotated
    // values as fp32
    p.rotate = true;
    p.numel = ceilDiv(f.numel, cfg.groupSize) * cfg.groupSize;
  }
  const int32_t raw = p.rotate ? int32_t(kFloat32) : p.dtype;
  // auto: two_step. It has the fewest quantization round trips (two, whatever the world size), so
  // the lowest error, and it needs two collectives where the rings need W-1 hops. The measured
  // crossovers that refine this live in benchmarks/RESULTS.md.
  p.algorithm = cfg.algorithm == kAuto ? kTwoStep : cfg.algorithm;
  p.rs = CodecSpec{cfg.rsBits, cfg.groupSize, cfg.symmetric ? 1 : 0, raw};
  p.ag = CodecSpec{cfg.agBits, cfg.groupSize, cfg.symmetric ? 1 : 0, raw};
  const int64_t g = cfg.groupSize;
  p.chunkElems = ceilDiv(ceilDiv(p.numel, g), f.world) * g;
  p.microshards = std::max(1, cfg.microshards);
  p.shardElems = ceilDiv(ceilDiv(p.chunkElems, g), p.microshards) * g;
  return p;
}

namespace {
constexpr int64_t kHeaderMagic = 0x71636f6d6d31;  // "qcomm1"
const char* const kHeaderNames[PlanHeader::kFields] = {
    "header",    "numel",
    "dtype",     "op",
    "algorithm", "rs_bits",
    "ag_bits",   "group_size",
    "symmetric", "microshards",
    "rotate",    "stochastic_rounding",
    "shadow",    "the call number (next_call_seq)"};

std::string fieldValue(int field, int64_t v) {
  switch (field) {
    case 2:
      return v == kFloat32 ? "float32" : v == kFloat16 ? "float16" : "bfloat16";
    case 3:
      return v ? "AVG" : "SUM";
    case 4:
      return algoName(int32_t(v));
    case 5:
    case 6:
      return v == 0 ? "none" : std::to_string(v);
    case 8:
    case 10:
    case 11:
      return v ? "true" : "false";
    default:
      return std::to_string(v);
  }
}
}  // namespace

PlanHeader headerOf(const Plan& p) {
  return PlanHeader{{kHeaderMagic, p.userNumel, p.userDtype, p.average ? 1 : 0, p.algorithm,
                     p.rs.bits, p.ag.bits, p.rs.groupSize, p.rs.symmetric, p.microshards,
                     p.rotate ? 1 : 0, p.stochastic ? 1 : 0, p.shadow, int64_t(p.callSeq)}};
}

uint32_t planFingerprint(const Plan& p) {
  const PlanHeader h = headerOf(p);
  uint32_t x = 2166136261u;  // FNV-1a, 32 bits
  auto mix = [&x](uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) x = (x ^ uint32_t(v & 0xFFu)) * 16777619u;
  };
  for (int f = 0; f < PlanHeader::kFields; ++f) mix(uint64_t(h.field[f]));
  mix(uint64_t(p.callSeq));
  return x;
}

std::string describeMismatch(const std::vector<PlanHeader>& headers) {
  for (int f = 0; f < PlanHeader::kFields; ++f) {
    for (size_t r = 1; r < headers.size(); ++r) {
      const int64_t a = headers[0].field[f], b = headers[r].field[f];
      if (a == b) continue;
      if (f == 0) return "rank " + std::to_string(r) + " is not in a quantized allreduce";
      return std::string(kHeaderNames[f]) + " is " + fieldValue(f, a) + " on rank 0 but " +
             fieldValue(f, b) + " on rank " + std::to_string(r);
    }
  }
  return "";
}

}  // namespace qcomm
