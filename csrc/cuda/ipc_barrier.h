// The separate kernels' barrier over the CUDA-IPC buffers, written once for two executors: the
// barrier kernel (ipc_kernels.cu, one thread) and a host emulation (csrc/testing/ipc_emulation.cpp,
// one thread per rank over host memory) that the CPU tests run. Each executor `ex` provides
// release(flag, v), load(flag) (an acquire load), wait(flag, value, step, peer, index) (false: it
// gave up, the error is recorded) and mismatch(peer, theirs, mine) (records that the peer's call
// differs, sets every rank's abort word, returns false).
#pragma once

#include "cuda/ipc_layout.h"

#ifndef QCOMM_PROTO_FN
#define QCOMM_PROTO_FN inline
#endif

namespace qcomm {
namespace ipc {

QCOMM_PROTO_FN uint32_t* word(uint8_t* buf, int64_t offset) {
  return reinterpret_cast<uint32_t*>(buf + offset);
}

// The flag through which rank src tells the owner of `buf` that it entered barrier `number`.
QCOMM_PROTO_FN uint32_t* barrierFlag(uint8_t* buf, uint32_t number, int src) {
  return word(buf, kIpcBarrierFlagsOffset) + int64_t(number & 1u) * kIpcMaxRanks + src;
}

// One barrier, run by one thread of this rank: take the next barrier number from this rank's
// count, release it into its flag in every peer's buffer, then wait until every peer has
// released the same number into this rank's buffer. Every rank enters the same barriers in the
// same order, so the numbers agree, and the count lives in the buffer (on the device), so a CUDA
// graph's replays keep counting. A peer can be at most one barrier ahead (it cannot leave barrier
// k + 1 before this rank enters it), and barriers of the other parity use other flags: the flag
// waited for cannot already hold a later number. `index` (the barrier's place in its call) only
// names it in an error. False: a wait gave up.
//
// With `check` (a call's first barrier) the barrier also compares the ranks' calls: before its
// releases this rank writes `fingerprint` (its plan's) into its word of every peer's buffer, and
// after each peer's release it reads that peer's word in its own: a different value means the
// calls differ, and the rank gives up (ex.mismatch records it and sets every rank's abort word),
// so a mismatched call stops every rank's kernels instead of moving bytes of the wrong sizes. A
// word is rewritten only at the peer's next call's first barrier, which it reaches after this
// rank has entered the barriers after this one (every call has more than one).
template <class Exec>
QCOMM_PROTO_FN bool barrier(Exec& ex, uint8_t* const* buffers, int rank, int world, uint32_t index,
                            bool check = false, uint32_t fingerprint = 0) {
  uint32_t* count = word(buffers[rank], kIpcBarrierCountOffset);
  const uint32_t number = *count + 1u;
  *count = number;
  if (check) {
    for (int j = 1; j < world; ++j) {
      ex.release(word(buffers[(rank + j) % world], kIpcFingerprintOffset) + rank, fingerprint);
    }
  }
  for (int j = 1; j < world; ++j) {
    ex.release(barrierFlag(buffers[(rank + j) % world], number, rank), number);
  }
  for (int j = 1; j < world; ++j) {
    const int q = (rank + j) % world;
    if (!ex.wait(barrierFlag(buffers[rank], number, q), number, 3u, q, index)) return false;
    if (check) {
      const uint32_t theirs = ex.load(word(buffers[rank], kIpcFingerprintOffset) + q);
      if (theirs != fingerprint) return ex.mismatch(q, theirs, fingerprint);
    }
  }
  return true;
}

}  // namespace ipc
}  // namespace qcomm
