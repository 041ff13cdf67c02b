// Plan selection: eligibility, algorithm choice for `auto`, codecs and chunk geometry.
#include "plan/plan.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <sstream>

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
  p.collective = f.collective;
  return p;
}

// The last rungs of a CUDA call (its eligibility otherwise checked): the opt-in, what the CUDA
// sharded path runs. CUDA calls are never tuned (auto runs two_step) nor shadowed (the exact
// result would be compared on the host, synchronizing every shadowed call with the device).
Plan cudaPlan(const CallFacts& f, const QuantConfig& cfg, Plan p) {
  auto passThrough = [&](const char* why) {
    p.quantize = false;
    p.reason = why;
    return p;
  };
  if (!f.cudaBuilt) return passThrough("CUDA tensor: qcomm was built without CUDA");
  if (!f.cudaOptIn) {
    return passThrough(f.collective == kAllreduce
                           ? "CUDA tensor: quantizing CUDA allreduces is opt-in "
                             "(QCOMM_CUDA_QUANTIZE=1)"
                           : "CUDA tensor: quantizing CUDA collectives is opt-in "
                             "(QCOMM_CUDA_QUANTIZE=1)");
  }
  Plan q = quantizedPlan(f, cfg);
  if (f.collective != kAllreduce && q.rotate) {
    // the per-shard padding and the rotation back of the reduce-scatter's output are built and
    // tested on host tensors only
    return passThrough(
        "CUDA tensor: rotated reduce_scatter and all_gather run on host tensors only "
        "(rotate=False quantizes them)");
  }
  q.shadow = 0;
  return q;
}

}  // namespace

const char* collectiveName(int32_t collective) {
  switch (collective) {
    case kReduceScatter:
      return "reduce_scatter";
    case kAllGather:
      return "all_gather";
    default:
      return "all_reduce";
  }
}

bool rotatesCall(const QuantConfig& cfg, int32_t collective) {
  if (cfg.rotate >= 0 || collective == kAllreduce) return rotates(cfg);
  // unset: on where the call's own codec has 4 bits (a reduce-scatter ships the reduce phase's,
  // an all-gather the gather phase's)
  return (collective == kReduceScatter ? cfg.rsBits : cfg.agBits) == 4;
}

bool sameTuningKey(const QuantConfig& a, const QuantConfig& b) {
  bool same = true;
#define QCOMM_SAME_KEY(type, member, name, value, key) \
  same = same && (!(key) || a.member == b.member);
  QCOMM_CONFIG_FIELDS(QCOMM_SAME_KEY)
#undef QCOMM_SAME_KEY
  for (int32_t c : {kAllreduce, kReduceScatter, kAllGather}) {
    same = same && rotatesCall(a, c) == rotatesCall(b, c);
  }
  return same;
}

ChunkRange Plan::chunk(int c) const {
  const int64_t begin = std::min<int64_t>(int64_t(c) * chunkElems, numel);
  return {begin, std::min<int64_t>(chunkElems, numel - begin)};
}

ChunkRange Plan::shard(int c, int k) const {
  const ChunkRange ch = chunk(c);
  const int64_t off = std::min<int64_t>(int64_t(k) * shardElems, ch.len);
  return {ch.begin + off, std::min<int64_t>(shardElems, ch.len - off)};
}

namespace {
std::atomic<int64_t> plans{0};
}  // namespace

int64_t plansMade() { return plans.load(); }

Plan makePlan(const CallFacts& f, const QuantConfig& cfg, const TuningTable* table) {
  plans++;
  Plan p = factsOnly(f);
  auto passThrough = [&](const char* why) {
    p.quantize = false;
    p.reason = why;
    return p;
  };
  const bool rs = f.collective == kReduceScatter, ag = f.collective == kAllGather;
  if (f.disabled) return passThrough("QCOMM_DISABLE=1: every collective passes through");
  if (cfg.algorithm == kAlgoNone) return passThrough("algorithm is none");
  if (rs && !cfg.reduceScatter) {
    return passThrough("reduce_scatter quantization is off (QuantConfig.reduce_scatter)");
  }
  if (ag && !cfg.allGather) {
    return passThrough("all_gather quantization is off (QuantConfig.all_gather)");
  }
  if (rs && cfg.rsBits == 0) return passThrough("the reduce phase is none");
  if (ag && cfg.agBits == 0) return passThrough("the gather phase is none");
  if (cfg.rsBits == 0 && cfg.agBits == 0) return passThrough("both phases are none");
  if (f.world < 2) return passThrough("world size 1");
  if (f.sparseOrComplex) return passThrough("sparse or complex tensor");
  if (!f.alike) {
    return passThrough(
        "the coalesced tensors differ in dtype, device or layout, or (reduce-scatter, all-gather) "
        "an input is not 1/W or W times its output");
  }
  if (f.dtype < 0) return passThrough("dtype is not fp32, fp16 or bf16");
  if (rs) {
    if (f.opPremul && f.premulTensor) return passThrough("PREMUL_SUM with a tensor factor");
    if (!f.opSum && !f.opAvg && !f.opPremul) {
      return passThrough("op is not SUM, AVG or PREMUL_SUM");
    }
  } else if (!ag && !f.opSum && !f.opAvg) {
    return passThrough("op is not SUM or AVG");
  }
  if (f.numel == 0) return passThrough("empty tensor");
  if (rs && !f.shapeOk) {
    return passThrough("output is not 1/W of the input (the list form: W inputs like each output)");
  }
  if (ag && !f.shapeOk) {
    return passThrough(
        "output is not W times the input (the list form: W outputs like each input)");
  }
  const int64_t bytes = f.numel * dtypeBytes(f.dtype);
  if (bytes < cfg.minBytes) return passThrough("message below min_bytes");
  if (f.cuda) return cudaPlan(f, cfg, p);
  if (cfg.algorithm != kAuto || table == nullptr) return quantizedPlan(f, cfg);
  return tunedPlan(f, cfg, table->find(f.dtype, sizeClassOf(bytes), f.collective));
}

Plan tunedPlan(const CallFacts& f, const QuantConfig& cfg, const TuneEntry* entry) {
  if (entry == nullptr) {
    Plan q = quantizedPlan(f, cfg);
    q.tuneNeeded = cfg.tune;
    return q;
  }
  if (entry->choice.exact()) {
    Plan p = factsOnly(f);
    p.reason = f.collective == kReduceScatter
                   ? "tuned: the exact reduce_scatter measured faster here"
               : f.collective == kAllGather ? "tuned: the exact all_gather measured faster here"
                                            : "tuned: the exact allreduce measured faster here";
    return p;
  }
  QuantConfig chosen = cfg;
  chosen.algorithm = entry->choice.algorithm;
  chosen.microshards = entry->choice.microshards;
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
  const bool sharded = f.collective != kAllreduce;
  const int64_t g = cfg.groupSize;
  // sharded calls: W rows (torch's shards), each padded on its own
  p.rows = sharded ? std::max(1, f.world) : 1;
  if (rotatesCall(cfg, f.collective)) {
    // whole groups: each row of the caller's message (the tensor, or each shard) padded with
    // zeros where it ends inside a group; the codec rotates each group as it encodes and
    // decodes, and a phase set to none ships the rotated values as fp32
    p.rotate = true;
    p.numel = ceilDiv(f.numel / p.rows, g) * g * p.rows;
  }
  const int32_t raw = p.rotate ? int32_t(kFloat32) : p.dtype;
  // auto: two_step. It has the fewest quantization round trips (two, whatever the world size), so
  // the lowest error, and it needs two collectives where the rings need W-1 hops. The measured
  // crossovers that refine this live in benchmarks/results/ (01 and 10).
  p.algorithm = cfg.algorithm == kAuto ? kTwoStep : cfg.algorithm;
  p.rs = CodecSpec{cfg.rsBits, cfg.groupSize, cfg.symmetric ? 1 : 0, raw};
  p.ag = CodecSpec{cfg.agBits, cfg.groupSize, cfg.symmetric ? 1 : 0, raw};
  // allreduce: chunks of whole groups; sharded calls: torch's shards (rotated: each padded to
  // whole groups), groups counted from each shard's first element (the codec's blocks start at
  // their first element)
  p.chunkElems = sharded ? p.numel / p.rows : ceilDiv(ceilDiv(p.numel, g), f.world) * g;
  p.microshards = std::max(1, cfg.microshards);
  p.shardElems = ceilDiv(ceilDiv(p.chunkElems, g), p.microshards) * g;
  if (f.collective == kAllGather) {
    // weights: the same bytes every time a shard is gathered (forward and backward)
    p.stochastic = false;
    p.average = false;
    p.algorithm = kTwoStep;
  }
  if (f.collective == kReduceScatter && f.opPremul) {
    p.premul = true;
    p.factor = float(f.premulFactor);
  }
  return p;
}

namespace {
// field 0: one magic per collective ("qcomm1" for allreduce, as before sharded calls existed)
constexpr int64_t kHeaderMagic = 0x71636f6d6d31;         // "qcomm1"
constexpr int64_t kMagicReduceScatter = 0x71636f6d7273;  // "qcomrs"
constexpr int64_t kMagicAllGather = 0x71636f6d6167;      // "qcomag"
int64_t magicOf(int32_t collective) {
  return collective == kReduceScatter ? kMagicReduceScatter
         : collective == kAllGather   ? kMagicAllGather
                                      : kHeaderMagic;
}
std::string collectiveOfMagic(int64_t m) {
  if (m == kHeaderMagic) return "a quantized allreduce";
  if (m == kMagicReduceScatter) return "a quantized reduce_scatter";
  if (m == kMagicAllGather) return "a quantized all_gather";
  return "no quantized collective";
}
// field 3: 0 SUM, 1 AVG, PREMUL_SUM: 2 | (the factor's fp32 bits << 8)
int64_t opField(const Plan& p) {
  if (!p.premul) return p.average ? 1 : 0;
  uint32_t bits;
  std::memcpy(&bits, &p.factor, sizeof(bits));
  return 2 | (int64_t(bits) << 8);
}
std::string opName(int64_t v) {
  if ((v & 0xFF) != 2) return v ? "AVG" : "SUM";
  const uint32_t bits = uint32_t(v >> 8);
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  std::ostringstream os;
  os << "PREMUL_SUM(" << f << ")";
  return os.str();
}
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
      return opName(v);
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
  return PlanHeader{{magicOf(p.collective), p.userNumel, p.userDtype, opField(p), p.algorithm,
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
      if (f == 0) {
        return "rank " + std::to_string(r) + " is in " + collectiveOfMagic(b) + ", rank 0 in " +
               collectiveOfMagic(a);
      }
      return std::string(kHeaderNames[f]) + " is " + fieldValue(f, a) + " on rank 0 but " +
             fieldValue(f, b) + " on rank " + std::to_string(r);
    }
  }
  return "";
}

}  // namespace qcomm
