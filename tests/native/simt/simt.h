// A SIMT emulator for running this project's CUDA kernels on the CPU, so the CPU tests execute
// the very kernel sources the GPU runs (csrc/cuda/*.cu): compiled as host C++ with this header
// forced in first (g++ -x c++ -include tests/native/simt/simt.h), launched through QCOMM_LAUNCH
// (csrc/cuda/launch.cuh).
//
// Model. A launch runs every block at once, each on its own OS thread (a kernel may wait on
// another rank's blocks, as the fused two_step does); inside a block each CUDA thread is a fiber
// (ucontext), switched cooperatively at the synchronising operations: __syncthreads, named
// barriers (bar.sync id, count), __syncwarp, __shfl_xor_sync, __shfl_sync, __ballot_sync and
// __nanosleep.
// `__shared__` is a thread_local static, so it is per block; dynamic shared memory (the bytes
// given at launch) is per block too, filled with 0xff bytes (a NaN in every float type) when the
// block starts. Memory is host memory; the atomics and fences are C++'s.
//
// Asynchronous copies into shared memory (cp.async: copyAsync, commit, wait) are held per thread
// and done only when the thread waits for their group, the destination filled with 0xff bytes
// from issue to then: a read before the wait, or a copy issued into a buffer still being read,
// changes the values.
//
// Under ThreadSanitizer (scripts/simt_check.sh with SIMT_TSAN=1) every fiber is a TSan fiber,
// switched without implied ordering; only __syncwarp and __syncthreads (and the atomics) order
// memory, as on the GPU, so a missing barrier between threads of one block is reported as a race
// whatever order the fibers happened to run in.
//
// What it checks beyond the values: every warp operation here takes the full mask, so all 32
// lanes must reach the same kind of operation together; a lane that exits while its warp waits
// at one, a mix of operations at one barrier, and a block whose every thread waits at a barrier
// that can no longer complete all abort with a message naming the block and warp.
#pragma once

#define QCOMM_SIMT 1
#define __global__
#define __device__
#define __host__
#define __shared__ static thread_local
#define __launch_bounds__(...)

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <functional>

namespace qcomm {
namespace simt {

struct Dim {
  unsigned x, y, z;
};

// The calling fiber's CUDA coordinates.
const Dim& threadIdxOf();
const Dim& blockIdxOf();
const Dim& blockDimOf();
const Dim& gridDimOf();

// Synchronising operations of the calling fiber.
enum class Op { kSyncWarp, kShuffle, kBallot };
void warpSync(Op op, unsigned mask);
void blockSync();
// bar.sync id, threads: the first `threads` arrivals at barrier `id` (1..15; whole warps) release
// each other, with __syncthreads' ordering among them
void namedBarrier(int id, int threads);
void yieldSpin();  // a spinning thread lets the others of its block and the other blocks run

// Run `body` as a grid of blocks x threads (1-D) with `shared` bytes of dynamic shared memory per
// block; returns when every block has finished.
void run(unsigned grid, unsigned block, const std::function<void()>& body, size_t shared = 0);

template <class... P>
struct Launcher {
  void (*kernel)(P...);
  unsigned grid, block;
  size_t shared;
  template <class... A>
  void operator()(A&&... args) const {
    void (*k)(P...) = kernel;
    run(grid, block, [&]() { k(args...); }, shared);
  }
};

template <class... P>
Launcher<P...> launcher(void (*kernel)(P...), int64_t grid, int64_t block, cudaStream_t,
                        size_t shared = 0) {
  return Launcher<P...>{kernel, unsigned(grid), unsigned(block), shared};
}
template <class... P>
Launcher<P...> launcher(void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t,
                        size_t shared = 0) {
  return Launcher<P...>{kernel, grid.x, block.x, shared};
}

// The calling block's dynamic shared memory (aborts when the launch gave none).
uint8_t* dynamicShared();

// cp.async of `bytes` (4, 8 or 16; both addresses aligned so, the destination in the block's
// dynamic shared memory) into the calling thread's open group; commit closes the group; wait
// completes all but the newest `pending` groups. A thread that exits with copies it never waited
// for aborts.
void copyAsync(void* dst, const void* src, int bytes);
void copyAsyncCommit();
void copyAsyncWait(int pending);

// The exchange itself (simt.cpp): the calling lane offers `v` and gets the word of lane
// (own lane ^ lane) when `isXor`, else of lane `lane`. Like the hardware, it orders no memory: only
// __syncwarp and __syncthreads do.
uint64_t shuffleWord(unsigned mask, uint64_t v, int lane, bool isXor);
unsigned ballot(unsigned mask, int pred);

template <class T>
T shuffle(unsigned mask, T v, int lane, bool isXor) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a wide type");
  uint64_t w = 0;
  std::memcpy(&w, &v, sizeof(T));
  w = shuffleWord(mask, w, lane, isXor);
  T r;
  std::memcpy(&r, &w, sizeof(T));
  return r;
}

inline uint32_t loadAcquire(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void storeRelease(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
uint64_t globalTimerNs();

}  // namespace simt
}  // namespace qcomm

#define threadIdx (::qcomm::simt::threadIdxOf())
#define blockIdx (::qcomm::simt::blockIdxOf())
#define blockDim (::qcomm::simt::blockDimOf())
#define gridDim (::qcomm::simt::gridDimOf())

inline void __syncthreads() { ::qcomm::simt::blockSync(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::qcomm::simt::warpSync(::qcomm::simt::Op::kSyncWarp, mask);
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int laneMask, int width = 32) {
  (void)width;
  return ::qcomm::simt::shuffle(mask, v, laneMask, true);
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int srcLane, int width = 32) {
  (void)width;
  return ::qcomm::simt::shuffle(mask, v, srcLane, false);
}
inline unsigned __ballot_sync(unsigned mask, int pred) { return ::qcomm::simt::ballot(mask, pred); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline void __nanosleep(unsigned) { ::qcomm::simt::yieldSpin(); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline unsigned atomicCAS(unsigned* p, unsigned expected, unsigned desired) {
  __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline long long clock64() { return static_cast<long long>(::qcomm::simt::globalTimerNs()); }
