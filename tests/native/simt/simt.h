// A SIMT emulator for running this project's CUDA kernels on the CPU, so the CPU tests execute
// the very kernel sources the GPU runs (csrc/cuda/*.cu): compiled as host C++ with this header
// forced in first (g++ -x c++ -include tests/native/simt/simt.h), launched through QCOMM_LAUNCH
// (csrc/cuda/launch.cuh).
//
// Model. A launch runs every block at once, each on its own OS thread (a kernel may wait on
// another rank's blocks, as the fused two_step does); inside a block each CUDA thread is a fiber
// (ucontext), switched cooperatively at the synchronising operations: __syncthreads, __syncwarp,
// __shfl_xor_sync, __ballot_sync and __nanosleep. `__shared__` is a thread_local static, so it is
// per block. Memory is host memory; the atomics and fences are C++'s.
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
void yieldSpin();       // a spinning thread lets the others of its block and the other blocks run
uint64_t* warpSlots();  // 32 words the lanes of the calling warp exchange values through
int laneId();

// Run `body` as a grid of blocks x threads (1-D); returns when every block has finished.
void run(unsigned grid, unsigned block, const std::function<void()>& body);

template <class... P>
struct Launcher {
  void (*kernel)(P...);
  unsigned grid, block;
  template <class... A>
  void operator()(A&&... args) const {
    void (*k)(P...) = kernel;
    run(grid, block, [&]() { k(args...); });
  }
};

template <class... P>
Launcher<P...> launcher(void (*kernel)(P...), int64_t grid, int64_t block, cudaStream_t) {
  return Launcher<P...>{kernel, unsigned(grid), unsigned(block)};
}
template <class... P>
Launcher<P...> launcher(void (*kernel)(P...), dim3 grid, dim3 block, cudaStream_t) {
  return Launcher<P...>{kernel, grid.x, block.x};
}

template <class T>
T shuffleXor(unsigned mask, T v, int laneMask) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffle of a wide type");
  uint64_t* slots = warpSlots();
  const int lane = laneId();
  uint64_t w = 0;
  std::memcpy(&w, &v, sizeof(T));
  slots[lane] = w;
  warpSync(Op::kShuffle, mask);
  T r;
  std::memcpy(&r, &slots[(lane ^ laneMask) & 31], sizeof(T));
  warpSync(Op::kShuffle, mask);  // nobody overwrites a slot before every lane has read
  return r;
}

inline unsigned ballot(unsigned mask, int pred) {
  uint64_t* slots = warpSlots();
  slots[laneId()] = pred != 0;
  warpSync(Op::kBallot, mask);
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r |= unsigned(slots[l] != 0) << l;
  warpSync(Op::kBallot, mask);
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
  return ::qcomm::simt::shuffleXor(mask, v, laneMask);
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
