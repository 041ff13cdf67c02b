// The transport over an inner c10d backend (c10d_transport.h).
#include "transport/c10d_transport.h"

#include <c10/util/Exception.h>

#include "common/errors.h"

namespace qcomm {
namespace {
// Our point-to-point tags live above 2^30, away from the small tags user code passes to send/recv
// on the same group, so a user's outstanding irecv can never match our bytes.
constexpr int kTagBase = 1 << 30;

std::string fromRank(int r) { return " from rank " + std::to_string(r); }
}  // namespace

C10dTransport::C10dTransport(c10d::Backend* inner, int rank, int world,
                             std::chrono::milliseconds timeout, Mode mode, bool streamOrdered)
    : Transport(rank, world),
      inner_(inner),
      timeout_(timeout),
      mode_(mode),
      streamOrdered_(streamOrdered) {
  TORCH_CHECK(inner_ != nullptr, rankPrefix(rank, world), "no inner backend for this device");
}

void C10dTransport::await(const c10::intrusive_ptr<c10d::Work>& w, const std::string& what) {
  // One sentence for the user: the step, the cause without a C++ backtrace, and the bound that
  // applied. A peer that died shows up as a reset connection at once; one that stopped, as a
  // time-out after the group's timeout. A null Work (a transfer inside a coalesced batch) is
  // nothing to wait for.
  if (!w) return;
  std::string cause;
  try {
    if (streamOrdered_) {
      w->wait();
    } else {
      w->wait(timeout_);
    }
    return;
  } catch (const c10::Error& e) {
    cause = e.what_without_backtrace();
  } catch (const std::exception& e) {
    cause = e.what();
  }
  TORCH_CHECK(false, rankPrefix(rank(), world()), call_, ": ", what, " failed (timeout ",
              timeout_.count(),
              " ms; a peer may have died or stopped, or issued a different collective: for "
              "instance its call passed through, with a size on the other side of min_bytes, "
              "another op or dtype, or another config): ",
              cause);
}

c10::intrusive_ptr<c10d::Work> C10dTransport::isend(const at::Tensor& t, int peer, int tag) {
  std::vector<at::Tensor> v{t};
  bytesSent_ += t.numel();
  return inner_->send(v, peer, kTagBase + tag);
}

c10::intrusive_ptr<c10d::Work> C10dTransport::irecv(const at::Tensor& t, int peer, int tag) {
  std::vector<at::Tensor> v{t};
  return inner_->recv(v, peer, kTagBase + tag);
}

int C10dTransport::sendsOf(const Exchange& x) const {
  if (x.kind == Exchange::kAllToAll) return world();
  if (x.kind == Exchange::kAllGather) return 1;
  int n = 0;
  for (const Exchange::Leg& l : x.legs) n += l.send ? 1 : 0;
  return n;
}

int C10dTransport::post(Exchange x) {
  const int id = int(exchanges_.size());
  exchanges_.push_back(State{std::move(x)});
  State& s = exchanges_.back();
  if (mode_ == kCollectives) {
    if (sendsOf(s.x) == 0) launch(s);  // only receives: nothing to wait for before it can go
    return id;
  }
  const Exchange& e = s.x;
  const int w = world();
  if (e.kind == Exchange::kLegs) {
    s.recvs.resize(e.legs.size());
    for (size_t i = 0; i < e.legs.size(); ++i) {
      const Exchange::Leg& l = e.legs[i];
      if (!l.send && l.bytes > 0) s.recvs[i] = irecv(l.slot.narrow(0, 0, l.bytes), l.peer, l.tag);
    }
    return id;
  }
  s.recvs.resize(size_t(w));
  for (int off = 1; off < w; ++off) {
    const int j = (rank() + off) % w;
    const int64_t n = e.kind == Exchange::kAllToAll ? e.bytes[size_t(rank())] : e.bytes[size_t(j)];
    if (n > 0) s.recvs[size_t(j)] = irecv(e.recv.narrow(0, j * e.stride, n), j, e.tag);
  }
  return id;
}

void C10dTransport::ready(int id, int i) {
  State& s = exchanges_.at(size_t(id));
  const Exchange& e = s.x;
  if (mode_ == kCollectives) {
    TORCH_CHECK(!s.launched, rankPrefix(rank(), world()), call_, ": ", e.what,
                ": more data declared ready than the exchange sends");
    if (++s.readies == sendsOf(e)) launch(s);
    return;
  }
  const int w = world();
  if (e.kind == Exchange::kLegs) {
    const Exchange::Leg& l = e.legs.at(size_t(i));
    if (l.bytes > 0) {
      sends_.emplace_back(isend(l.slot.narrow(0, 0, l.bytes), l.peer, l.tag),
                          e.what + " (send to rank " + std::to_string(l.peer) + ")");
    }
    return;
  }
  if (e.kind == Exchange::kAllToAll) {
    const int64_t n = e.bytes[size_t(i)];
    if (i != rank() && n > 0) {
      sends_.emplace_back(isend(e.send.narrow(0, i * e.stride, n), i, e.tag),
                          e.what + " (send to rank " + std::to_string(i) + ")");
    }
    return;
  }
  const int64_t n = e.bytes[size_t(rank())];  // all-gather: this rank's bytes to every peer
  if (n == 0) return;
  for (int off = 1; off < w; ++off) {
    const int j = (rank() + off) % w;
    sends_.emplace_back(isend(e.send.narrow(0, 0, n), j, e.tag),
                        e.what + " (send to rank " + std::to_string(j) + ")");
  }
}

void C10dTransport::launch(State& s) {
  const Exchange& e = s.x;
  s.launched = true;
  std::vector<int64_t> none;
  switch (e.kind) {
    case Exchange::kAllToAll: {
      at::Tensor out = e.recv, in = e.send;
      bytesSent_ += in.numel() / world() * (world() - 1);
      s.works.push_back(inner_->alltoall_base(out, in, none, none));
      return;
    }
    case Exchange::kAllGather: {
      at::Tensor out = e.recv, in = e.send;
      bytesSent_ += in.numel() * (world() - 1);
      s.works.push_back(inner_->_allgather_base(out, in));
      return;
    }
    case Exchange::kLegs: {
      // one batch, as batch_isend_irecv does, where the inner backend coalesces (NCCL)
      const bool batch = inner_->supportsCoalescing();
      if (batch) inner_->startCoalescing();
      for (const Exchange::Leg& l : e.legs) {
        s.works.push_back(l.send ? isend(l.slot, l.peer, l.tag) : irecv(l.slot, l.peer, l.tag));
      }
      if (batch) s.works.push_back(inner_->endCoalescing());
      return;
    }
  }
}

void C10dTransport::waitAll(State& s) {
  TORCH_CHECK(s.launched, rankPrefix(rank(), world()), call_, ": ", s.x.what,
              ": waited for before all its data to send was ready");
  if (s.done) return;
  for (auto& w : s.works) await(w, s.x.what);
  s.done = true;
}

const uint8_t* C10dTransport::wait(int id, int i) {
  State& s = exchanges_.at(size_t(id));
  const Exchange& e = s.x;
  if (e.kind == Exchange::kLegs) {
    const Exchange::Leg& l = e.legs.at(size_t(i));
    if (mode_ == kCollectives) {
      waitAll(s);
    } else if (s.recvs[size_t(i)]) {
      await(s.recvs[size_t(i)], e.what + " (receive from rank " + std::to_string(l.peer) + ")");
      s.recvs[size_t(i)].reset();
    }
    return l.slot.data_ptr<uint8_t>();
  }
  if (mode_ == kCollectives) {
    waitAll(s);
    return e.recv.data_ptr<uint8_t>() + int64_t(i) * e.stride;
  }
  if (i == rank()) {  // this rank's own slot never travels
    const int64_t own = e.kind == Exchange::kAllToAll ? int64_t(i) * e.stride : 0;
    return e.send.data_ptr<uint8_t>() + own;
  }
  if (s.recvs[size_t(i)]) {
    await(s.recvs[size_t(i)], e.what + fromRank(i));
    s.recvs[size_t(i)].reset();
  }
  return e.recv.data_ptr<uint8_t>() + int64_t(i) * e.stride;
}

void C10dTransport::finish() {
  for (State& s : exchanges_) {
    if (mode_ == kCollectives) {
      waitAll(s);
      continue;
    }
    for (size_t i = 0; i < s.recvs.size(); ++i) {
      if (s.recvs[i]) await(s.recvs[i], s.x.what);
      s.recvs[i].reset();
    }
  }
  for (auto& [w, what] : sends_) await(w, what);
  sends_.clear();
}

void C10dTransport::allGatherNow(at::Tensor& out, at::Tensor& in, const std::string& what) {
  bytesSent_ += in.numel() * (world() - 1);
  c10::intrusive_ptr<c10d::Work> w;
  try {  // Gloo raises at once when a peer's connection is already closed
    w = inner_->_allgather_base(out, in);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, rankPrefix(rank(), world()), call_, ": ", what,
                " failed: ", e.what_without_backtrace());
  }
  await(w, what);
}

}  // namespace qcomm
