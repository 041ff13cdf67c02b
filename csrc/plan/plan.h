// The plan: a pure function of facts every rank shares (numel, dtype, op, world size, config,
// tuning table).
// It never looks at data, timing or memory, so every rank takes the same path (DESIGN invariant 6).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "plan/config.h"
#include "plan/tuning.h"

namespace qcomm {

// The collective a plan serves. The numbers are part of the C++/Python contract (qcomm.plan's
// `collective`, the tuning cache).
enum Collective : int32_t { kAllreduce = 0, kReduceScatter = 1, kAllGather = 2 };
// "all_reduce", "reduce_scatter" or "all_gather" (the keys of stats()["by_collective"]).
const char* collectiveName(int32_t collective);

struct ChunkRange {
  int64_t begin;
  int64_t len;
};

struct Plan {
  bool quantize = false;  // false: pass through to the inner backend, `reason` says why
  std::string reason;
  int32_t algorithm = kAlgoNone;  // kTwoStep, kRing or kSemiRing when quantize
  CodecSpec rs{};                 // reduce phase codec (bits 0 = raw input dtype)
  CodecSpec ag{};                 // gather phase codec
  int32_t dtype = kFloat32;
  bool average = false;
  // The collective. A reduce-scatter runs the reduce half of plan.algorithm and hands each summed
  // piece of this rank's chunk to the caller's output; an all-gather runs the gather phase alone
  // (algorithm is then two_step's, unused). Sharded calls (both) cut the message into chunks of
  // exactly numel / world elements, torch's shards, with quantization groups counted from each
  // chunk's first element.
  int32_t collective = kAllreduce;
  // PREMUL_SUM (reduce-scatter): the owner multiplies the fp32 sum by `factor` (the op's factor
  // as fp32, never the tensor's dtype) before the cast into the output.
  bool premul = false;
  float factor = 1.0f;
  int world = 1;
  int64_t numel = 0;
  // Chunk c of the message is [c * chunkElems, ...) clipped to numel: one chunk per rank. The
  // allreduce's is a multiple of the group size so that no quantization group straddles two
  // chunks; a sharded call's is a row (the shard, or rotated its padded row).
  int64_t chunkElems = 0;
  // Rings split each chunk into `microshards` shards of shardElems (a multiple of the group size)
  // so that the transfer of one overlaps the decode-add-encode of the previous one.
  int32_t microshards = 1;
  int64_t shardElems = 0;
  // Rotation: the algorithm runs on a message of `numel` elements of the caller's dtype, and the
  // codec rotates each group on its way in and out (schedule.h Call::encodeInput); userNumel and
  // userDtype describe the caller's message. The message is `rows` rows (1 for the allreduce, W
  // for sharded calls: torch's shards), each the caller's row of userNumel / rows elements padded
  // with zeros to whole groups (the caller pads: algorithms.h paddedCopy), so that chunk c of a
  // sharded call is row c, its groups start at the row's first element, and the padding never
  // reaches the caller's tensors.
  bool rotate = false;
  int32_t rows = 1;
  // Stochastic rounding, and the call's sequence number on this group (counted alike on every
  // rank; it seeds the rounding noise, set by the backend).
  bool stochastic = false;
  uint32_t callSeq = 0;
  int64_t userNumel = 0;
  int32_t userDtype = kFloat32;
  // auto with a tuning table: `tuned` when this plan is the table's choice (for its collective,
  // dtype and size class); `tuneNeeded` when config.tune asks for a measurement of the class
  // first (the plan is then two_step's until the measurement has decided).
  bool tuned = false;
  bool tuneNeeded = false;
  // Shadow mode (config.shadow): every shadow-th call by callSeq also runs the exact allreduce of
  // a copy of its input (shadowed()); part of the header, since it adds an exchange.
  int32_t shadow = 0;
  bool shadowed() const { return shadow > 0 && callSeq % uint32_t(shadow) == 0; }

  // The caller's elements of one row (userNumel / rows): a sharded call's shard.
  int64_t userRowElems() const { return userNumel / std::max<int64_t>(1, rows); }

  ChunkRange chunk(int c) const;
  ChunkRange shard(int c, int k) const;  // absolute element range of shard k of chunk c
};

// Stochastic-rounding noise of this rank's encodes in the reduce (phase 0) and gather (phase 1)
// phases; `begin` is the block's first element in the message. Every rank encodes each element
// at most once per phase, so (call, rank, phase, element) never repeats within a call.
inline Noise rsNoise(const Plan& p, int rank, int64_t begin) {
  return Noise{noiseSalt(p.callSeq, rank, 0), begin, p.stochastic ? 1 : 0};
}
inline Noise agNoise(const Plan& p, int rank, int64_t begin) {
  return Noise{noiseSalt(p.callSeq, rank, 1), begin, p.stochastic ? 1 : 0};
}

// Facts about one call. dtype is -1 when the tensor's dtype is not fp32/fp16/bf16. numel is the
// message's: the tensor (allreduce), the input (reduce-scatter) or the output (all-gather).
struct CallFacts {
  int64_t numel = 0;
  int32_t dtype = -1;
  bool opSum = false;
  bool opAvg = false;
  bool sparseOrComplex = false;
  int world = 1;
  int32_t collective = kAllreduce;
  // sharded calls: the shard is numel / world elements of the message's dtype, both dense
  bool shapeOk = true;
  // PREMUL_SUM: with a host (double) factor, or with a tensor factor (passes through)
  bool opPremul = false;
  bool premulTensor = false;
  double premulFactor = 1.0;
  // a coalesced call: its tensors share one dtype and device and can be packed into one message
  bool alike = true;
  // where the call runs, and the group's switches that gate it
  bool disabled = false;   // QCOMM_DISABLE=1 at the group's creation: every call passes through
  bool cuda = false;       // CUDA tensors (never tuned, never shadowed)
  bool cudaBuilt = false;  // qcomm was built with its CUDA kernels
  bool cudaOptIn = false;  // QCOMM_CUDA_QUANTIZE=1: CUDA calls quantize (opt-in)
};

// Whether a call of `collective` rotates: QuantConfig.rotate where set; unset (-1), the
// allreduce rotates where a phase has 4 bits (config.h rotates()), a reduce-scatter where rs_bits
// is 4 and an all-gather where ag_bits is 4 (the codec the call ships).
bool rotatesCall(const QuantConfig& cfg, int32_t collective);

// Whether the tuning table measured under `a` still says what is fastest under `b`: every field
// that keys the table (config.h QCOMM_CONFIG_FIELDS) alike, and every collective rotated alike.
bool sameTuningKey(const QuantConfig& a, const QuantConfig& b);

// The plan of one call: every gate (the disabled switch, the config's switches, the tensors'
// dtype, op and shapes, min_bytes, the CUDA opt-in and what CUDA calls run) is a rung of this one
// ladder, and the reason of the first that refuses is the pass-through plan's. `table`: the
// group's tuning table, consulted where cfg.algorithm is auto for host tensors (none: the
// config's plan; a backend call plans without it and reads the table on its queue: tunedPlan).
Plan makePlan(const CallFacts& f, const QuantConfig& cfg, const TuningTable* table = nullptr);

// The table's choice for an auto call of an eligible class: `entry` null (not measured), the
// config's plan (tuneNeeded where cfg.tune); exact, a pass-through plan; else the quantized plan
// of the chosen algorithm (tuned).
Plan tunedPlan(const CallFacts& f, const QuantConfig& cfg, const TuneEntry* entry);

// makePlan's calls in this process so far (a test counts one per collective call).
int64_t plansMade();

// The quantized plan of an eligible call (makePlan's result once every check has passed): the
// algorithm, codecs and chunk geometry. It checks nothing; tests use it to plan world size 1.
Plan quantizedPlan(const CallFacts& f, const QuantConfig& cfg);

// What every rank must agree on before a quantized allreduce moves data: the facts its plan was
// made from, and the call's number (callSeq: it seeds the rounding noise and decides which calls
// shadow mode shadows). Ranks exchange these few bytes first, so a mismatch (a different numel,
// dtype, op, config or call number on some rank) becomes a clear error on every rank instead of a
// hang or wrong numbers.
struct PlanHeader {
  static constexpr int kFields = 14;
  int64_t field[kFields];
};

PlanHeader headerOf(const Plan& p);

// A 32-bit digest of the call: its header and its call number (callSeq). The CUDA-IPC transport
// compares it across ranks in the call's first barrier instead of exchanging headers on the host
// (ipc_barrier.h): equal headers and call numbers give equal fingerprints; different ones differ
// but for a chance of about 2^-32 (FNV-1a over the fields).
uint32_t planFingerprint(const Plan& p);

// Empty when all headers agree; otherwise a sentence naming the first field that differs and the
// ranks and values involved.
std::string describeMismatch(const std::vector<PlanHeader>& headers);

}  // namespace qcomm
