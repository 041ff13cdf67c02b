// What the three schedules share (inside csrc/algo/): the pieces a chunk is cut into, the call's
// buffers and pointers, and the gather phase (gather.cpp).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "algo/scratch.h"
#include "codec/codec_ops.h"
#include "plan/plan.h"
#include "transport/transport.h"

namespace qcomm {
namespace algo {

// a mod w in [0, w), for rank arithmetic that may go negative.
inline int wrapRank(int a, int w) { return ((a % w) + w) % w; }

// One call (allreduce, reduce-scatter or all-gather): the plan, the transport, the codec, the
// message, and the pieces each chunk is cut into: the plan's microshards where the transport
// overlaps transfers with the codec, else one (the whole chunk). A reduce-scatter's `out` is the
// caller's shard (contiguous, chunkElems of plan.dtype); its message is never written.
struct Call {
  Call(const Plan& p, Transport& tr, CodecOps& o, at::Tensor& d, Scratch* s,
       at::Tensor* shardOut = nullptr)
      : plan(p),
        t(tr),
        ops(o),
        data(d),
        out(shardOut),
        scratch(s),
        rank(tr.rank()),
        world(p.world),
        pieces(tr.overlapsCodec() ? p.microshards : 1),
        pieceElems(pieces == p.microshards ? p.shardElems : p.chunkElems) {}

  const Plan& plan;
  Transport& t;
  CodecOps& ops;
  at::Tensor& data;
  at::Tensor* out;
  Scratch* scratch;  // the group's kept buffers, or none (each buffer allocated for the call)
  const int rank;
  const int world;
  const int pieces;
  const int64_t pieceElems;
  std::string step = "set-up";  // what runs now, for errors that do not say it themselves

  // Piece k of chunk c: its absolute element range in the message (len 0 past the chunk's end).
  ChunkRange piece(int c, int k) const {
    return pieces == plan.microshards ? plan.shard(c, k) : plan.chunk(c);
  }
  // This rank's input at element `offset` (plan.dtype).
  void* input(int64_t offset) const {
    return static_cast<uint8_t*>(data.data_ptr()) + offset * dtypeBytes(plan.dtype);
  }
  float* inputFloats(int64_t offset) const { return static_cast<float*>(input(offset)); }
  // fp32 messages keep their partial sums in place, in the chunk's own elements: each rank adds
  // its input to a chunk once, so that input is not needed again. Others sum in an fp32 scratch,
  // and so does a reduce-scatter: its message is the caller's input, which stays unchanged.
  bool inPlace() const { return plan.dtype == kFloat32 && plan.collective != kReduceScatter; }
  // Whether the schedule ends with the gather phase (allreduce, all-gather): a reduce-scatter
  // hands the owner's sums to its output instead, and needs no gather buffers.
  bool gathers() const { return plan.collective != kReduceScatter; }
  // The gather unit, 0 where there is no gather phase.
  int64_t gatherUnit() const { return gathers() ? unit(plan.ag) : 0; }
  // The encoded bytes of a piece (a reduce or gather unit), and its slot: 16-byte aligned.
  int64_t bytes(int64_t elems, const CodecSpec& c) const { return encodedBytes(elems, c); }
  int64_t unit(const CodecSpec& c) const { return alignUp16(encodedBytes(pieceElems, c)); }
  // Encoded length of piece k of every chunk.
  std::vector<int64_t> pieceBytes(int k, const CodecSpec& c) const {
    std::vector<int64_t> b(static_cast<size_t>(world));
    for (int j = 0; j < world; ++j) b[size_t(j)] = encodedBytes(piece(j, k).len, c);
    return b;
  }
  // 16-bit messages over a transport that overlaps the codec: the gather phase's bytes travel in
  // the message itself, each piece's encoded bytes in that piece's own elements (GatherPhase), so
  // that phase needs no buffers. Where some piece's encoding would not fit in its elements (a
  // partial group of a few elements) or the message is not 16-byte aligned, it keeps its buffers.
  bool gatherInMessage() const {
    if (!t.overlapsCodec() || inPlace() || world < 2 || !gathers()) return false;
    if (reinterpret_cast<uintptr_t>(data.data_ptr()) % 16 != 0) return false;
    for (int j = 0; j < world; ++j) {
      for (int k = 0; k < pieces; ++k) {
        const int64_t n = piece(j, k).len;
        if (encodedBytes(n, plan.ag) > n * dtypeBytes(plan.dtype)) return false;
      }
    }
    return true;
  }
  // The message's bytes of elements [begin, begin + len).
  at::Tensor messageBytes(ChunkRange r) const {
    const int64_t w = dtypeBytes(plan.dtype);
    return data.reshape({-1}).view(at::kByte).narrow(0, r.begin * w, r.len * w);
  }
  // Rotated plans (plan.rotate): the message holds the caller's values; the codec rotates each
  // group on its way in (encodeInput, localForHop) and back on its way out (decodeOutput), and
  // every sum between is in the rotated domain.
  // The reduce codec's block of the input's elements [begin, begin + len).
  void encodeInput(int64_t begin, int64_t len, uint8_t* dst, const Noise& noise) const {
    if (plan.rotate) {
      ops.encodeRotated(input(begin), plan.dtype, len, plan.rs, dst, noise);
    } else {
      ops.encode(input(begin), plan.dtype, len, plan.rs, dst, noise);
    }
  }
  // The local input a ring hop adds to what it received, and its dtype: the input itself, or for
  // a rotated plan its rotation, written into `partial` (the hop's fp32 sum, which the hop then
  // accumulates into in place).
  const void* localForHop(ChunkRange r, float* partial, int32_t* dtype) const {
    if (!plan.rotate) {
      *dtype = plan.dtype;
      return input(r.begin);
    }
    ops.rotateToFloat(input(r.begin), plan.dtype, r.len, plan.rs.groupSize, partial);
    *dtype = kFloat32;
    return partial;
  }
  // out = this rank's input of elements r in fp32 (rotated, for a rotated plan): the owner's own
  // values, which never travel. Nothing to do where out is the fp32 input itself, unrotated.
  void ownToFloat(ChunkRange r, float* out) const {
    if (r.len == 0) return;
    if (plan.rotate) {
      ops.rotateToFloat(input(r.begin), plan.dtype, r.len, plan.rs.groupSize, out);
    } else if (out != input(r.begin)) {
      ops.castToFloat(input(r.begin), plan.dtype, r.len, out);
    }
  }
  // out = the gather codec's block decoded (and rotated back, for a rotated plan). result: out is
  // the call's output, not read again by the call (CodecOps::decodeResult).
  void decodeOutput(const uint8_t* bytes, int64_t len, float* out, bool result) const {
    if (plan.rotate) {
      ops.decodeRotated(bytes, len, plan.ag, out);
    } else if (result) {
      ops.decodeResult(bytes, len, plan.ag, out);
    } else {
      ops.decode(bytes, len, plan.ag, out, false);
    }
  }
  at::Tensor byteBuffer(int64_t n) const {
    if (scratch) return scratch->take(n, data.options());
    return at::empty({n}, data.options().dtype(at::kByte));
  }
  at::Tensor floatBuffer(int64_t n) const {
    if (scratch) return scratch->take(n * int64_t(sizeof(float)), data.options()).view(at::kFloat);
    return at::empty({n}, data.options().dtype(at::kFloat));
  }
  static uint8_t* at(const at::Tensor& t, int64_t offset) { return t.data_ptr<uint8_t>() + offset; }
};

// What the reduce half of a schedule gives each summed piece of this rank's own chunk to: the
// gather phase (allreduce) or the caller's output (reduce-scatter, ShardOutput).
class OwnChunk {
 public:
  virtual ~OwnChunk() = default;
  // Piece k of this rank's chunk is summed in `sum` (fp32, the piece's length; it may be
  // modified). Call it for every piece, also an empty one.
  virtual void ownPieceReady(int k, float* sum) = 0;
  // After the reduce half: completes what the pieces started.
  virtual void finish() = 0;
  // A world of one, where the rings have no hop: the sum of each piece is the input itself.
  virtual void fromInput() = 0;
};

// The gather phase every schedule ends with: as soon as a piece of this rank's own chunk is
// summed, it is divided (AVG), encoded with the gather codec and sent to every rank, and decoded
// into place from those same bytes (the owner never keeps its private fp32 sum: DESIGN invariant
// 1); every peer's pieces are decoded into place as they arrive. Its exchanges are declared when
// it is built, so that over a transport that overlaps the codec the receives are posted before
// the reduce phase starts.
class GatherPhase final : public OwnChunk {
 public:
  // send: pieces x the gather unit; recv: pieces x W units (both empty where
  // Call::gatherInMessage(): each piece's bytes then go from, and arrive in, the message's own
  // elements of that piece, and this rank's own pieces are decoded after its sends have left);
  // scratch: fp32, a piece long (where the message is not fp32). tagBase: the first tag this
  // phase may use.
  GatherPhase(Call& c, at::Tensor send, at::Tensor recv, float* scratch, int tagBase);

  // AVG divides the sum, the gather codec encodes it, and every rank (this one too) decodes it.
  void ownPieceReady(int k, float* sum) override;

  // Decodes every peer's pieces as they arrive.
  void finish() override;

  // Also the all-gather: each rank's slot of the message is its input.
  void fromInput() override;

 private:
  // Decodes the gather-phase bytes of `range` into the message (through the scratch for fp16 and
  // bf16).
  void decodeToOutput(const uint8_t* bytes, ChunkRange range);

  Call& c_;
  const bool inMessage_;
  at::Tensor send_, recv_;
  float* scratch_;
  int64_t unit_;
  std::vector<int> ids_;  // the exchange of piece k
};

// A reduce-scatter's end: each summed piece of this rank's chunk is scaled in fp32 (AVG divides by
// W, PREMUL_SUM multiplies by the plan's factor) and cast into the caller's output. It posts no
// exchange and allocates nothing.
class ShardOutput final : public OwnChunk {
 public:
  explicit ShardOutput(Call& c) : c_(c) {}
  void ownPieceReady(int k, float* sum) override;
  void finish() override {}
  void fromInput() override;

 private:
  Call& c_;
};

// The sink of the call's collective: a GatherPhase over these buffers (see its constructor), or
// a ShardOutput for a reduce-scatter (the buffers are then empty and unused).
std::unique_ptr<OwnChunk> ownChunkSink(Call& c, at::Tensor send, at::Tensor recv, float* scratch,
                                       int tagBase);

// The all-gather: the gather phase alone, each rank's slot of the message holding its input.
void allGather(Call& c);

}  // namespace algo
}  // namespace qcomm
