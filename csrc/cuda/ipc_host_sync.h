// The host side of ipc_sync.cuh: acquire loads, release stores, a rank's first error and the
// bounded spin of a wait through the CUDA-IPC buffers (ipc_layout.h), for the emulations that run
// the IPC protocols with one CPU thread per rank over host memory (the separate kernels' barrier,
// csrc/testing/ipc_emulation.cpp; the fused experiment's protocol, csrc/experiments/ipc_fused/).
// Plain host C++: no CUDA and no torch. `A` is any argument struct with IpcPeers' fields (buffers,
// world, rank, timeoutNs, hostError); they give up as the kernels do.
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

#include "cuda/ipc_barrier.h"  // ipc::word
#include "cuda/ipc_layout.h"

namespace qcomm {
namespace ipc {

inline uint32_t hostLoadAcquire(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void hostStoreRelease(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

// Record the rank's first error (the first code wins; host memory shared by the ranks).
template <class A>
void hostRecordError(const A& a, uint32_t code, uint32_t step, int peer, int64_t tile,
                     uint32_t epoch) {
  uint32_t none = 0;
  if (__atomic_compare_exchange_n(&a.hostError->code, &none, code, false, __ATOMIC_ACQ_REL,
                                  __ATOMIC_ACQUIRE)) {
    a.hostError->step = step;
    a.hostError->peer = uint32_t(peer);
    a.hostError->tile = uint32_t(tile);
    a.hostError->epoch = epoch;
    a.hostError->rank = uint32_t(a.rank);
  }
}

// The host side of ipcGiveUp (ipc_sync.cuh): recorded, every rank's abort word set; false.
template <class A>
bool hostGiveUp(const A& a, uint32_t code, uint32_t step, int peer, int64_t tile, uint32_t epoch) {
  hostRecordError(a, code, step, peer, tile, epoch);
  for (int r = 0; r < a.world; ++r) hostStoreRelease(word(a.buffers[r], kIpcAbortOffset), 1u);
  return false;
}

// Spin (yielding) until *flag == value; false when this rank gives up (time-out: recorded, and
// every rank's abort word set) or a peer already gave up (its abort word).
template <class A>
bool hostSpinWait(const A& a, const uint32_t* flag, uint32_t value, uint32_t step, int peer,
                  int64_t tile) {
  const uint32_t* abortWord = word(a.buffers[a.rank], kIpcAbortOffset);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (hostLoadAcquire(flag) == value) return true;
    if (hostLoadAcquire(abortWord) != 0u) {
      hostRecordError(a, 2u, step, peer, tile, value);
      return false;
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    if (std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count() > a.timeoutNs) {
      return hostGiveUp(a, 1u, step, peer, tile, value);
    }
    std::this_thread::yield();
  }
}

}  // namespace ipc
}  // namespace qcomm
