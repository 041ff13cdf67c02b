// two_step, ring and semi_ring over an inner backend's collectives (collective_algos.h).
//
// The schedules are those of algo_two_step.cpp, algo_ring.cpp and algo_semi_ring.cpp: the same
// chunks, the same encoding rank and noise for every element, the same fp32 sums in the same
// order. What differs is the transfer: each step moves whole chunks, not microshards, because an
// NCCL transfer waits for all earlier work on the current stream and so cannot overlap the codec
// kernels of that stream anyway. Microshards are whole groups and an element's noise depends only
// on its index in the message, so the bits do not change.
#include "algo/collective.h"

#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <string>
#include <vector>

#include "algo/algorithms.h"
#include "backend/backend.h"
#include "transport/c10d_transport.h"

namespace qcomm {
namespace {

// One point-to-point transfer of a hop.
struct Leg {
  at::Tensor* buf;
  int peer;
  bool send;
  int tag;
};

class Collective {
 public:
  // ex moves two_step's and the gather phase's bytes; hops (null: two_step only) the rings'.
  Collective(const Plan& plan, ByteExchange& ex, Transport* hops, int rank, at::Tensor& data,
             CodecOps& ops)
      : p_(plan),
        ex_(ex),
        t_(hops),
        rank_(rank),
        data_(data),
        ops_(ops),
        own_(plan.chunk(rank)),
        sum_(floats(plan.chunkElems)),
        send_(bytes(std::max(twoStepBytes(plan), agUnit(plan)))),
        recv_(bytes(std::max(twoStepBytes(plan), agUnit(plan) * plan.world))) {}

  // Reduce this rank's chunk into sum_, then the gather phase.
  void run() {
    switch (p_.algorithm) {
      case kTwoStep:
        twoStep();
        break;
      case kRing:
        ring();
        break;
      case kSemiRing:
        semiRing();
        break;
      default:
        TORCH_CHECK(false, "unknown algorithm ", p_.algorithm);
    }
    gather();
  }

  const std::string& step() const { return step_; }

 private:
  // two_step's encoded chunks, W units (0 for the rings); the gather codec's unit
  static int64_t twoStepBytes(const Plan& p) {
    return p.algorithm == kTwoStep ? alignUp16(encodedBytes(p.chunkElems, p.rs)) * p.world : 0;
  }
  static int64_t agUnit(const Plan& p) { return alignUp16(encodedBytes(p.chunkElems, p.ag)); }
  at::Tensor bytes(int64_t n) const { return at::empty({n}, data_.options().dtype(at::kByte)); }
  at::Tensor floats(int64_t n) const { return at::empty({n}, data_.options().dtype(at::kFloat)); }
  void* input(int64_t elem) const { return elemPtr(data_.data_ptr(), p_.dtype, elem); }
  static uint8_t* ptr(at::Tensor& b, int64_t offset = 0) { return b.data_ptr<uint8_t>() + offset; }
  float* sum() { return sum_.data_ptr<float>(); }
  std::string peerName(int r) const { return "rank " + std::to_string(r); }

  // This rank's input chunk c, encoded with the reduce codec: a chain's first hop, or two_step's
  // unit for rank c.
  void encodeInput(int c, uint8_t* dst) {
    const ChunkRange ch = p_.chunk(c);
    ops_.encode(input(ch.begin), p_.dtype, ch.len, p_.rs, dst, rsNoise(p_, rank_, ch.begin));
  }

  // An intermediate rank of a chain: partial = decoded + local chunk c, re-encoded into `out`.
  void forward(at::Tensor& in, int c, at::Tensor& partial, at::Tensor& out) {
    const ChunkRange ch = p_.chunk(c);
    ops_.decodeAddEncode(ptr(in), p_.rs, input(ch.begin), p_.dtype, ch.len,
                         partial.data_ptr<float>(), p_.rs, ptr(out), rsNoise(p_, rank_, ch.begin));
  }

  // One hop: every leg in one batch (NCCL launches them as a group, as batch_isend_irecv does),
  // then a wait on each, which on CUDA only orders the current stream after the transfers.
  void hop(const std::vector<Leg>& legs, const std::string& what) {
    step_ = what;
    TORCH_CHECK(t_ != nullptr, "the rings need the inner backend's point-to-point transfers");
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    t_->startBatch();
    for (const Leg& l : legs) {
      works.push_back(l.send ? t_->isend(*l.buf, l.peer, l.tag) : t_->irecv(*l.buf, l.peer, l.tag));
    }
    works.push_back(t_->endBatch());
    for (auto& w : works) t_->wait(w, what);
  }

  // A world of one: the sum is the input.
  void sumIsInput() { ops_.castToFloat(input(own_.begin), p_.dtype, own_.len, sum()); }

  // Every rank encodes each chunk, one all-to-all delivers chunk j's W copies to rank j, which
  // decodes and sums them in rank order 0..W-1 (its own copy included, as sent).
  void twoStep() {
    const int world = p_.world;
    const int64_t unit = alignUp16(encodedBytes(p_.chunkElems, p_.rs));
    at::Tensor in = send_.narrow(0, 0, unit * world);
    at::Tensor out = recv_.narrow(0, 0, unit * world);
    step_ = "two_step reduce phase (encode)";
    for (int c = 0; c < world; ++c) encodeInput(c, ptr(in, c * unit));
    std::vector<const uint8_t*> copies(static_cast<size_t>(world));
    ex_.allToAll(out, in, "two_step reduce phase (all-to-all)", copies.data());
    step_ = "two_step reduce phase (sum)";
    ops_.decodeSum(copies.data(), world, own_.len, p_.rs, sum());
  }

  // W-1 hops to the next rank; at step s rank r sends chunk r-s-1 and receives chunk r-s-2, which
  // is its own at the last step: sum = decoded + local.
  void ring() {
    const int world = p_.world;
    const int steps = world - 1;
    if (steps == 0) return sumIsInput();
    const int next = wrapRank(rank_ + 1, world);
    const int prev = wrapRank(rank_ - 1, world);
    const int64_t unit = alignUp16(encodedBytes(p_.chunkElems, p_.rs));
    at::Tensor send = bytes(unit);
    at::Tensor recv = bytes(unit);
    at::Tensor partial = floats(steps > 1 ? p_.chunkElems : 0);
    step_ = "ring reduce-scatter (encode)";
    encodeInput(wrapRank(rank_ - 1, world), ptr(send));
    for (int s = 0; s < steps; ++s) {
      const int c = wrapRank(rank_ - s - 2, world);
      hop({{&send, next, true, s}, {&recv, prev, false, s}},
          "ring reduce-scatter step " + std::to_string(s) + " (send to " + peerName(next) +
              ", receive chunk " + std::to_string(c) + " from " + peerName(prev) + ")");
      if (s + 1 < steps) {
        forward(recv, c, partial, send);
      } else {
        ops_.decode(ptr(recv), own_.len, p_.rs, sum(), false);
        ops_.addToFloat(input(own_.begin), p_.dtype, own_.len, sum());
      }
    }
  }

  // Each chunk reduced from both sides (algo_semi_ring.cpp): the right chain (R = W/2 ranks above
  // the owner, each sending to the rank below) and the left chain (L = (W-1)/2 ranks below,
  // starting R-L steps later); the owner sums (decoded right + local) + decoded left.
  void semiRing() {
    const int world = p_.world;
    const int right = world / 2;
    const int left = (world - 1) / 2;
    if (right == 0) return sumIsInput();
    const int next = wrapRank(rank_ + 1, world);
    const int prev = wrapRank(rank_ - 1, world);
    const int64_t unit = alignUp16(encodedBytes(p_.chunkElems, p_.rs));
    struct Dir {
      int steps;
      int start;  // the global step of this direction's first hop
      int sendPeer;
      int recvPeer;
      at::Tensor send, recv, partial;
    };
    Dir dirs[2] = {{right, 0, prev, next, bytes(unit), bytes(unit), floats(p_.chunkElems)},
                   {left, right - left, next, prev, bytes(left ? unit : 0), bytes(left ? unit : 0),
                    floats(left ? p_.chunkElems : 0)}};
    step_ = "semi_ring reduce-scatter (encode)";
    for (int d = 0; d < 2; ++d) {
      if (dirs[d].steps > 0) encodeInput(semiRingSendChunk(rank_, world, d, 0), ptr(dirs[d].send));
    }
    for (int s = 0; s < right; ++s) {
      std::vector<Leg> legs;
      for (int d = 0; d < 2; ++d) {
        if (s < dirs[d].start) continue;
        legs.push_back({&dirs[d].send, dirs[d].sendPeer, true, s * 2 + d});
        legs.push_back({&dirs[d].recv, dirs[d].recvPeer, false, s * 2 + d});
      }
      hop(legs, "semi_ring reduce-scatter step " + std::to_string(s) + " (with " + peerName(next) +
                    " and " + peerName(prev) + ")");
      for (int d = 0; d < 2; ++d) {
        const int ds = s - dirs[d].start;  // this direction's own step
        if (ds < 0) continue;
        if (ds + 1 < dirs[d].steps) {
          forward(dirs[d].recv, semiRingRecvChunk(rank_, world, d, ds), dirs[d].partial,
                  dirs[d].send);
        } else {
          float* half = d == 0 ? sum() : dirs[1].partial.data_ptr<float>();
          ops_.decode(ptr(dirs[d].recv), own_.len, p_.rs, half, false);
        }
      }
    }
    ops_.addToFloat(input(own_.begin), p_.dtype, own_.len, sum());
    if (left > 0) ops_.addToFloat(dirs[1].partial.data_ptr<float>(), kFloat32, own_.len, sum());
  }

  // The owner divides (AVG) and encodes its sum with the gather codec; one all-gather gives every
  // rank every chunk's bytes, which all ranks (the owner too) decode into place.
  void gather() {
    const int world = p_.world;
    const int64_t unit = agUnit(p_);
    step_ = "gather phase (encode)";
    if (p_.average) ops_.divide(sum(), own_.len, world);
    // the reduce phase's buffers again: what read or wrote them before is ordered before this
    // (the host waited for the Gloo transfers; on CUDA the stream, NCCL's Work::wait, and the
    // IPC exchange's copies are stream-ordered)
    at::Tensor mine = send_.narrow(0, 0, unit);
    at::Tensor all = recv_.narrow(0, 0, unit * world);
    ops_.encode(sum(), kFloat32, own_.len, p_.ag, ptr(mine), agNoise(p_, rank_, own_.begin));
    std::vector<const uint8_t*> parts(static_cast<size_t>(world));
    ex_.allGather(all, mine, "gather phase (all-gather)", parts.data());
    step_ = "gather phase (decode)";
    for (int j = 0; j < world; ++j) {
      const ChunkRange ch = p_.chunk(j);
      if (p_.dtype == kFloat32) {
        ops_.decode(parts[j], ch.len, p_.ag, static_cast<float*>(input(ch.begin)), false);
      } else {  // through sum_, free again
        ops_.decode(parts[j], ch.len, p_.ag, sum(), false);
        ops_.castFromFloat(sum(), ch.len, p_.dtype, input(ch.begin));
      }
    }
  }

  const Plan& p_;
  ByteExchange& ex_;
  Transport* t_;
  int rank_;
  at::Tensor& data_;
  CodecOps& ops_;
  ChunkRange own_;
  at::Tensor sum_;  // fp32: this rank's chunk, summed
  // Byte buffers of two_step's exchange and of the gather, allocated with the collective: a call
  // allocates nothing once its first exchange has begun (over CUDA IPC with ranks as threads of
  // one process, an allocation that synchronises the device would wait for a peer's barrier
  // kernel, which waits for this rank). send_: two_step's encoded chunks, then the gather's own
  // unit; recv_: what the exchange delivers, then the gathered units.
  at::Tensor send_, recv_;
  std::string step_ = "set-up";
};

}  // namespace

namespace {

// Checks the call, then runs it; an error names the step that failed.
void runChecked(const Plan& plan, ByteExchange& ex, Transport* hops, int rank, at::Tensor& data,
                CodecOps& ops) {
  const std::string where = rankPrefix(rank, plan.world) + "allreduce: ";
  TORCH_CHECK_VALUE(!plan.rotate, where,
                    "rotate=True is not supported by the collective (NCCL) path yet; set "
                    "QuantConfig(rotate=False) for this group");
  TORCH_CHECK_VALUE(plan.quantize, where, "the plan passes through (", plan.reason, ")");
  TORCH_CHECK_VALUE(data.is_contiguous() && data.numel() == plan.numel &&
                        codecDtype(data.scalar_type()) == plan.dtype,
                    where, "expected a contiguous tensor of ", plan.numel,
                    " elements of the plan's dtype, got ", data.sizes(), " ", data.scalar_type());
  Collective c(plan, ex, hops, rank, data, ops);
  try {
    c.run();
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    if (msg.rfind("[qcomm rank", 0) == 0) throw;  // a transport error already says it all
    TORCH_CHECK(false, where, c.step(), " failed: ", msg);
  }
}

}  // namespace

void runCollective(const Plan& plan, c10d::Backend& inner, int rank, at::Tensor& data,
                   CodecOps& ops, std::chrono::milliseconds timeout) {
  Transport t(&inner, rank, plan.world, timeout, data.is_cuda());
  runChecked(plan, t, &t, rank, data, ops);
}

void runTwoStepOver(const Plan& plan, ByteExchange& ex, int rank, at::Tensor& data, CodecOps& ops) {
  TORCH_CHECK(plan.algorithm == kTwoStep, rankPrefix(rank, plan.world),
              "allreduce: this exchange runs two_step only, not ", algoName(plan.algorithm));
  runChecked(plan, ex, nullptr, rank, data, ops);
}

at::Tensor collectiveAllreduceForTest(QncclBackend& be, at::Tensor t, bool avg, bool forceWorld1,
                                      int64_t callSeq, std::chrono::milliseconds timeout) {
  const std::string where =
      rankPrefix(be.getRank(), be.getSize()) + "collective_allreduce_for_test: ";
  Plan plan;
  if (forceWorld1) {
    TORCH_CHECK_VALUE(be.getSize() == 1, where, "force_world1 needs a group of one rank, not ",
                      be.getSize());
    CallFacts f;
    f.numel = t.numel();
    f.dtype = codecDtype(t.scalar_type());
    f.opSum = !avg;
    f.opAvg = avg;
    f.world = 1;
    TORCH_CHECK_VALUE(f.dtype >= 0 && f.numel > 0 && t.layout() == at::kStrided, where,
                      "needs a non-empty dense fp32, fp16 or bf16 tensor");
    plan = quantizedPlan(f, be.getConfig());
  } else {
    plan = be.planFor(t, c10d::ReduceOp(avg ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM));
  }
  TORCH_CHECK_VALUE(plan.quantize, where, "this allreduce would pass through (", plan.reason, ")");
  plan.callSeq = callSeq >= 0 ? uint32_t(callSeq) : be.nextCallSeq();
  c10::intrusive_ptr<c10d::Backend> inner = be.inner(t.is_cuda());
  TORCH_CHECK_VALUE(inner, where, "the group has no inner backend for ", t.device());
  const c10::DeviceGuard guard(t.device());
  at::Tensor buf = t.contiguous();
  std::unique_ptr<CodecOps> ops = codecOpsFor(t.device());
  runCollective(plan, *inner, be.getRank(), buf, *ops, timeout);
  if (!buf.is_same(t)) t.copy_(buf);
  return t;
}

}  // namespace qcomm
