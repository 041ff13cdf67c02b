// The device side of waiting on a peer through the CUDA-IPC buffers (ipc_layout.h): acquire loads
// and release stores at system scope, the global timer, and a bounded spin that records why it
// gave up. Shared by the separate kernels' barrier (ipc_kernels.cu) and the fused two_step
// experiment. `A` is any argument struct with IpcPeers' fields (buffers, world, rank, timeoutNs,
// hostError).
#pragma once

#include <cstdint>

#include "cuda/ipc_layout.h"

namespace qcomm {
namespace gpu {

#if defined(QCOMM_SIMT)
// the SIMT emulator of the CPU tests: the same orderings as C++ atomics
using simt::globalTimerNs;
using simt::loadAcquire;
using simt::storeRelease;
#else
__device__ __forceinline__ uint32_t loadAcquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void storeRelease(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#endif

__device__ __forceinline__ uint32_t* ipcWord(uint8_t* buf, int64_t offset) {
  return reinterpret_cast<uint32_t*>(buf + offset);
}

// The first error of this rank claims a word in its own buffer, then fills the host-mapped
// record, its code last, so the host never reads a code without its fields.
template <class A>
__device__ void ipcRecordError(const A& a, uint32_t code, uint32_t step, int peer, int64_t tile,
                               uint32_t epoch) {
  if (atomicCAS(ipcWord(a.buffers[a.rank], kIpcErrorClaimOffset), 0u, 1u) == 0u) {
    volatile IpcError* e = a.hostError;
    e->step = step;
    e->peer = uint32_t(peer);
    e->tile = uint32_t(tile);
    e->epoch = epoch;
    e->rank = uint32_t(a.rank);
    __threadfence_system();
    e->code = code;
    __threadfence_system();
  }
}

// This rank gives up first (a time-out, code 1; a call that differs, code 3): record it and set
// every rank's abort word, so that every rank's kernels stop. Returns false.
template <class A>
__device__ bool ipcGiveUp(const A& a, uint32_t code, uint32_t step, int peer, int64_t tile,
                          uint32_t epoch) {
  ipcRecordError(a, code, step, peer, tile, epoch);
  for (int r = 0; r < a.world; ++r) storeRelease(ipcWord(a.buffers[r], kIpcAbortOffset), 1u);
  return false;
}

// Spin until *flag == value; false when this rank gives up (time-out: recorded, and every rank's
// abort word set) or a peer already gave up.
template <class A>
__device__ bool ipcSpinWait(const A& a, const uint32_t* flag, uint32_t value, uint32_t step,
                            int peer, int64_t tile) {
  if (loadAcquire(flag) == value) return true;
  const uint32_t* abortWord = ipcWord(a.buffers[a.rank], kIpcAbortOffset);
  const uint64_t start = globalTimerNs();
  for (uint32_t i = 1;; ++i) {
    if (loadAcquire(flag) == value) return true;
    if ((i & 255u) == 0u) {
      if (loadAcquire(abortWord) != 0u) {
        ipcRecordError(a, 2u, step, peer, tile, value);
        return false;
      }
      if (int64_t(globalTimerNs() - start) > a.timeoutNs) {
        return ipcGiveUp(a, 1u, step, peer, tile, value);
      }
      __nanosleep(128);
    }
  }
}

}  // namespace gpu
}  // namespace qcomm
