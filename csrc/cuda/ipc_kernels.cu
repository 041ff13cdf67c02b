// The separate kernels over CUDA IPC (ipc_kernels.h): a one-thread barrier kernel and a copy
// kernel.
#define QCOMM_PROTO_FN __device__ __forceinline__
#include "cuda/ipc_barrier.h"
#include "cuda/ipc_kernels.h"
#include "cuda/ipc_sync.cuh"
#include "cuda/launch.cuh"
#include "cuda/tile_codec.cuh"

namespace qcomm {
namespace gpu {
namespace {

// The barrier's executor. Its release follows copies of earlier kernels of the stream (copy
// engine or not), which no barrier of this kernel orders: hence the system-scope fence before it.
struct BarrierExec {
  const IpcPeers& p;
  __device__ void release(uint32_t* flag, uint32_t v) const {
    __threadfence_system();
    storeRelease(flag, v);
  }
  __device__ uint32_t load(const uint32_t* flag) const { return loadAcquire(flag); }
  __device__ bool wait(const uint32_t* flag, uint32_t value, uint32_t step, int peer,
                       int64_t index) const {
    return ipcSpinWait(p, flag, value, step, peer, index);
  }
  __device__ bool mismatch(int peer, uint32_t theirs, uint32_t mine) const {
    return ipcGiveUp(p, 3u, 3u, peer, int64_t(theirs), mine);
  }
};

__global__ void exchangeBarrier(IpcPeers p, uint32_t index, bool check, uint32_t fingerprint) {
  BarrierExec ex{p};
  ipc::barrier(ex, p.buffers, p.rank, p.world, index, check, fingerprint);
}

// A call whose kernels gave up (this rank's abort word is set) leaves no numbers behind: every
// byte of its message becomes 0xFF, a NaN in fp32, bf16 and fp16. Otherwise nothing is written.
__global__ void poisonIfAborted(const uint32_t* abortWord, uint8_t* data, int64_t bytes) {
  if (loadAcquire(abortWord) == 0u) return;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < bytes; b += stride) {
    data[b] = 0xFF;
  }
}

// The copies of one step of the exchange: every thread of the grid takes its share of each copy
// in turn, 16 bytes at a time where the copy allows it.
__global__ void exchangeCopies(IpcCopies copies) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int i = 0; i < copies.count; ++i) {
    const IpcCopy c = copies.copy[i];
    const bool vec = aligned(c.dst, 16) && aligned(c.src, 16);
    const int64_t vectors = vec ? c.bytes / 16 : 0;
    const int4* from = reinterpret_cast<const int4*>(c.src);
    int4* to = reinterpret_cast<int4*>(c.dst);
    for (int64_t v = first; v < vectors; v += stride) to[v] = from[v];
    for (int64_t b = vectors * 16 + first; b < c.bytes; b += stride) c.dst[b] = c.src[b];
  }
}

}  // namespace

cudaError_t ipcBarrier(const IpcPeers& p, uint32_t index, const uint32_t* fingerprint,
                       cudaStream_t stream) {
  QCOMM_LAUNCH(exchangeBarrier, 1, 1, stream)
  (p, index, fingerprint != nullptr, fingerprint != nullptr ? *fingerprint : 0u);
  return cudaGetLastError();
}

cudaError_t ipcPoisonIfAborted(const IpcPeers& p, uint8_t* data, int64_t bytes,
                               cudaStream_t stream) {
  if (bytes <= 0) return cudaSuccess;
  const uint32_t* abortWord =
      reinterpret_cast<const uint32_t*>(p.buffers[p.rank] + kIpcAbortOffset);
  QCOMM_LAUNCH(poisonIfAborted, 4, 256, stream)(abortWord, data, bytes);
  return cudaGetLastError();
}

cudaError_t ipcCopy(const IpcCopies& copies, int maxBlocks, cudaStream_t stream) {
  int64_t most = 0;
  for (int i = 0; i < copies.count; ++i) {
    most = copies.copy[i].bytes > most ? copies.copy[i].bytes : most;
  }
  if (most == 0) return cudaSuccess;
  constexpr int kCopyThreads = 256;
  const int64_t need = (most / 16 + kCopyThreads * 4 - 1) / (kCopyThreads * 4);
  const int blocks = int(need < maxBlocks ? (need > 0 ? need : 1) : maxBlocks);
  QCOMM_LAUNCH(exchangeCopies, blocks, kCopyThreads, stream)(copies);
  return cudaGetLastError();
}

cudaError_t ipcPreload() {
#if defined(QCOMM_SIMT)
  return cudaSuccess;
#else
  // referencing a kernel loads it (see ipc_kernels.h)
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, exchangeBarrier);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, exchangeCopies);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, poisonIfAborted);
  return e;
#endif
}

}  // namespace gpu
}  // namespace qcomm
