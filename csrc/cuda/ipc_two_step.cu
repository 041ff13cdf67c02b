// The fused, persistent two_step over CUDA IPC (Flash Communication's two steps in one kernel).
//
// Each launch handles one piece (csrc/ipc_layout.h) with a grid of at most one block per SM, so
// every block is resident and no block ever waits for another block of its own launch. A block
// takes tasks in three phases, in this order:
//   A. reduce sends: tile t of chunk c (every c != rank, peers in rotated order rank+1, ...) is
//      encoded with the reduce codec straight into rank c's buffer, slot [rank][t]; then a
//      release store of the piece's epoch into rank c's reduce flag [rank][t];
//   B. own tiles: encode this rank's own tile into its own slot, wait (acquire) for the reduce
//      flags of every peer, decode the W copies and sum them in fp32 in rank order 0..W-1 (AVG
//      divides by W), encode the sum with the gather codec into its own gather slot, copy those
//      bytes into every peer's gather slot [rank][t] and release its gather flag; then decode its
//      own output from the same bytes (identical output on every rank);
//   C. gather: wait for owner o's gather flag [o][t] and decode its bytes into place.
// A tasks never wait, B waits only for A, C only for B: no cycle, whatever the interleaving of
// ranks (processes that share one GPU run by time-slicing and still make progress).
//
// Flags hold the piece's epoch, read from this rank's control word on the device (epoch + 1 +
// piece) and advanced by a one-thread kernel after the last piece, so graph replays keep counting.
// A slot is rewritten only after its reader has finished with it: rank q writes rank c's reduce
// slot for the next piece only after finishing this one, which needed c's gather bytes, which c
// sends after reading the slot; the gather slots likewise. Every spin is bounded by timeoutNs;
// a rank that gives up records rank, step, peer and tile in host-mapped memory and sets the abort
// word of every rank, so the others stop spinning too.
#include "ipc_two_step.h"
#include "warp_codec.cuh"

namespace qcomm {
namespace gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;

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

__device__ __forceinline__ uint32_t* word(uint8_t* buf, int64_t offset) {
  return reinterpret_cast<uint32_t*>(buf + offset);
}

__device__ __forceinline__ uint32_t* reduceFlag(uint8_t* buf, int src, int64_t slot) {
  return word(buf, kIpcReduceFlagsOffset) + int64_t(src) * kIpcMaxSlots + slot;
}

__device__ __forceinline__ uint32_t* gatherFlag(uint8_t* buf, int owner, int64_t slot) {
  return word(buf, kIpcGatherFlagsOffset) + int64_t(owner) * kIpcMaxSlots + slot;
}

__device__ __forceinline__ uint8_t* reduceSlot(uint8_t* buf, const IpcGeometry& g, int src,
                                               int64_t slot) {
  return buf + kIpcDataOffset + (int64_t(src) * g.pieceTiles + slot) * g.slotBytes;
}

__device__ __forceinline__ uint8_t* gatherSlot(uint8_t* buf, const IpcGeometry& g, int world,
                                               int owner, int64_t slot) {
  return buf + kIpcDataOffset + ((int64_t(world) + owner) * g.pieceTiles + slot) * g.slotBytes;
}

// Element range of tile t of chunk c; len <= 0 when the chunk has no such tile.
struct Tile {
  int64_t begin;
  int64_t len;
};

__device__ __forceinline__ Tile tileOf(const IpcTwoStepArgs& a, int c, int64_t t) {
  const int64_t chunkBegin = int64_t(c) * a.chunkElems;
  int64_t chunkLen = a.numel - chunkBegin;
  chunkLen = chunkLen < a.chunkElems ? chunkLen : a.chunkElems;
  const int64_t off = t * a.geometry.tileElems;
  int64_t len = chunkLen - off;
  len = len < a.geometry.tileElems ? len : a.geometry.tileElems;
  return {chunkBegin + off, len};
}

__device__ __forceinline__ float rawLoad(const uint8_t* src, int32_t dtype, int64_t i) {
  if (dtype == kFloat32) return reinterpret_cast<const float*>(src)[i];
  if (dtype == kFloat16) return toFloat(reinterpret_cast<const fp16_t*>(src)[i]);
  return toFloat(reinterpret_cast<const bf16_t*>(src)[i]);
}

__device__ __forceinline__ void rawStore(uint8_t* dst, int32_t dtype, int64_t i, float v) {
  if (dtype == kFloat32)
    reinterpret_cast<float*>(dst)[i] = v;
  else if (dtype == kFloat16)
    reinterpret_cast<fp16_t*>(dst)[i] = fromFloat<fp16_t>(v);
  else
    reinterpret_cast<bf16_t*>(dst)[i] = fromFloat<bf16_t>(v);
}

// Element e of an encoded block of n elements, as fp32.
__device__ __forceinline__ float decodeElem(const uint8_t* block, int64_t n, const CodecSpec& c,
                                            int64_t e) {
  if (c.bits == 0) return rawLoad(block, c.rawDtype, e);
  if (c.bits == 8) {
    return c.symmetric ? decodeAt<8, true>(block, n, c, e) : decodeAt<8, false>(block, n, c, e);
  }
  return c.symmetric ? decodeAt<4, true>(block, n, c, e) : decodeAt<4, false>(block, n, c, e);
}

template <int kBits, bool kSym, class F>
__device__ void encodeGroupWarp(const CodecSpec& c, int64_t n, int64_t gi, int glen, uint8_t* block,
                                const Noise& noise, F value) {
  const GroupParams p = warpGroupParams<kSym>(glen, kBits, value);
  if (threadIdx.x % kWarp == 0) storeParams(block, n, c, gi, p);
  warpQuantize<kBits, kSym>(p, gi * c.groupSize, glen, block + dataOffset(n, c), noise, value);
}

// One warp encodes group gi of an n-element block whose values come from value(k), k in the
// group; noise.base is the absolute index of the block's first element.
template <class F>
__device__ void encodeGroup(const CodecSpec& c, int64_t n, int64_t gi, uint8_t* block,
                            const Noise& noise, F value) {
  const int glen = groupLength(n, c, gi);
  if (c.bits == 0) {
    const int64_t begin = gi * c.groupSize;
    for (int k = threadIdx.x % kWarp; k < glen; k += kWarp) {
      rawStore(block, c.rawDtype, begin + k, value(k));
    }
  } else if (c.bits == 8) {
    if (c.symmetric)
      encodeGroupWarp<8, true>(c, n, gi, glen, block, noise, value);
    else
      encodeGroupWarp<8, false>(c, n, gi, glen, block, noise, value);
  } else {
    if (c.symmetric)
      encodeGroupWarp<4, true>(c, n, gi, glen, block, noise, value);
    else
      encodeGroupWarp<4, false>(c, n, gi, glen, block, noise, value);
  }
}

// The whole block encodes x[tile] with the reduce codec into dst.
template <class T>
__device__ void encodeTile(const IpcTwoStepArgs& a, const T* x, Tile tile, uint8_t* dst) {
  const Noise noise{a.rsNoise.salt, tile.begin, a.rsNoise.on};
  const int64_t groups = numGroups(tile.len, a.rs);
  for (int64_t gi = threadIdx.x / kWarp; gi < groups; gi += kWarps) {
    const T* g = x + tile.begin + gi * a.rs.groupSize;
    encodeGroup(a.rs, tile.len, gi, dst, noise, [&](int k) { return toFloat(g[k]); });
  }
}

template <class T>
__device__ void decodeTileToOutput(const IpcTwoStepArgs& a, const uint8_t* src, Tile tile, T* x) {
  for (int64_t e = threadIdx.x; e < tile.len; e += blockDim.x) {
    x[tile.begin + e] = fromFloat<T>(decodeElem(src, tile.len, a.ag, e));
  }
}

__device__ void recordError(const IpcTwoStepArgs& a, uint32_t code, uint32_t step, int peer,
                            int64_t tile, uint32_t epoch) {
  if (atomicCAS(&a.hostError->code, 0u, code) == 0u) {
    a.hostError->step = step;
    a.hostError->peer = uint32_t(peer);
    a.hostError->tile = uint32_t(tile);
    a.hostError->epoch = epoch;
    a.hostError->rank = uint32_t(a.rank);
    __threadfence_system();
  }
}

// Thread 0 only: spin until *flag == epoch. False when this rank gives up (time-out, recorded,
// and every rank's abort word set) or a peer already gave up.
__device__ bool waitFlag(const IpcTwoStepArgs& a, const uint32_t* flag, uint32_t epoch,
                         uint32_t step, int peer, int64_t tile) {
  if (loadAcquire(flag) == epoch) return true;
  const uint32_t* abortWord = word(a.buffers[a.rank], kIpcAbortOffset);
  const uint64_t start = globalTimerNs();
  for (uint32_t i = 1;; ++i) {
    if (loadAcquire(flag) == epoch) return true;
    if ((i & 255u) == 0u) {
      if (loadAcquire(abortWord) != 0u) {
        recordError(a, 2u, step, peer, tile, epoch);
        return false;
      }
      if (int64_t(globalTimerNs() - start) > a.timeoutNs) {
        recordError(a, 1u, step, peer, tile, epoch);
        for (int r = 0; r < a.world; ++r) storeRelease(word(a.buffers[r], kIpcAbortOffset), 1u);
        return false;
      }
      __nanosleep(128);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) twoStepPiece(IpcTwoStepArgs a, int64_t piece) {
  __shared__ float sums[kWarps * 1024];
  __shared__ int giveUp;
  const IpcGeometry& g = a.geometry;
  uint8_t* own = a.buffers[a.rank];
  T* x = static_cast<T*>(a.data);
  const uint32_t epoch = *word(own, kIpcEpochOffset) + 1u + uint32_t(piece);
  const int64_t first = piece * g.pieceTiles;
  int64_t slots = g.tilesPerChunk - first;
  slots = slots < g.pieceTiles ? slots : g.pieceTiles;
  const int peers = a.world - 1;
  if (threadIdx.x == 0) giveUp = 0;

  // A. reduce sends
  for (int64_t task = blockIdx.x; task < int64_t(peers) * slots; task += gridDim.x) {
    const int c = (a.rank + 1 + int(task / slots)) % a.world;
    const int64_t s = task % slots;
    const Tile tile = tileOf(a, c, first + s);
    if (tile.len <= 0) continue;
    encodeTile(a, x, tile, reduceSlot(a.buffers[c], g, a.rank, s));
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      storeRelease(reduceFlag(a.buffers[c], a.rank, s), epoch);
    }
  }

  // B. own tiles: sum, encode, push, decode own output
  for (int64_t s = blockIdx.x; s < slots; s += gridDim.x) {
    const Tile tile = tileOf(a, a.rank, first + s);
    if (tile.len <= 0) continue;
    encodeTile(a, x, tile, reduceSlot(own, g, a.rank, s));
    if (threadIdx.x == 0) {
      for (int j = 1; j <= peers && !giveUp; ++j) {
        const int q = (a.rank + j) % a.world;
        if (!waitFlag(a, reduceFlag(own, q, s), epoch, 1u, q, first + s)) giveUp = 1;
      }
    }
    __syncthreads();
    if (giveUp) return;
    const int warp = threadIdx.x / kWarp;
    float* mine = sums + warp * a.ag.groupSize;
    const Noise agNoise{a.agNoise.salt, tile.begin, a.agNoise.on};
    uint8_t* out = gatherSlot(own, g, a.world, a.rank, s);
    const int64_t groups = numGroups(tile.len, a.ag);
    for (int64_t gi = warp; gi < groups; gi += kWarps) {
      const int glen = groupLength(tile.len, a.ag, gi);
      const int64_t begin = gi * a.ag.groupSize;
      for (int k = threadIdx.x % kWarp; k < glen; k += kWarp) {
        float acc = decodeElem(reduceSlot(own, g, 0, s), tile.len, a.rs, begin + k);
        for (int q = 1; q < a.world; ++q) {
          acc = acc + decodeElem(reduceSlot(own, g, q, s), tile.len, a.rs, begin + k);
        }
        mine[k] = a.average ? acc / float(a.world) : acc;
      }
      __syncwarp();
      encodeGroup(a.ag, tile.len, gi, out, agNoise, [&](int k) { return mine[k]; });
      __syncwarp();
    }
    __syncthreads();
    const int64_t vecs = alignUp16(encodedBytes(tile.len, a.ag)) / 16;
    for (int j = 1; j <= peers; ++j) {
      const int o = (a.rank + j) % a.world;
      const int4* src = reinterpret_cast<const int4*>(out);
      int4* dst = reinterpret_cast<int4*>(gatherSlot(a.buffers[o], g, a.world, a.rank, s));
      for (int64_t v = threadIdx.x; v < vecs; v += blockDim.x) dst[v] = src[v];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      for (int j = 1; j <= peers; ++j) {
        storeRelease(gatherFlag(a.buffers[(a.rank + j) % a.world], a.rank, s), epoch);
      }
    }
    decodeTileToOutput(a, out, tile, x);
    __syncthreads();
  }

  // C. gather: decode every other owner's tiles into place
  for (int64_t task = blockIdx.x; task < int64_t(peers) * slots; task += gridDim.x) {
    const int o = (a.rank + 1 + int(task / slots)) % a.world;
    const int64_t s = task % slots;
    const Tile tile = tileOf(a, o, first + s);
    if (tile.len <= 0) continue;
    if (threadIdx.x == 0 && !waitFlag(a, gatherFlag(own, o, s), epoch, 2u, o, first + s)) {
      giveUp = 1;
    }
    __syncthreads();
    if (giveUp) return;
    decodeTileToOutput(a, gatherSlot(own, g, a.world, o, s), tile, x);
    __syncthreads();
  }
}

__global__ void advanceEpoch(uint8_t* own, uint32_t pieces) {
  *word(own, kIpcEpochOffset) += pieces;
}

template <class T>
cudaError_t launchPieces(const IpcTwoStepArgs& a, cudaStream_t stream) {
  const IpcGeometry& g = a.geometry;
  for (int64_t p = 0; p < g.pieces; ++p) {
    const int64_t slots = g.tilesPerChunk - p * g.pieceTiles < g.pieceTiles
                              ? g.tilesPerChunk - p * g.pieceTiles
                              : g.pieceTiles;
    const int64_t tasks = slots * (a.world > 1 ? a.world - 1 : 1);
    int blocks = int(tasks < a.smCount ? tasks : a.smCount);
    blocks = blocks > 1 ? blocks : 1;
    twoStepPiece<T><<<blocks, kThreads, 0, stream>>>(a, p);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  advanceEpoch<<<1, 1, 0, stream>>>(a.buffers[a.rank], uint32_t(g.pieces));
  return cudaGetLastError();
}

}  // namespace

cudaError_t ipcTwoStep(const IpcTwoStepArgs& a, cudaStream_t stream) {
  if (a.numel == 0 || a.geometry.pieces == 0) return cudaSuccess;
  switch (a.dtype) {
    case kFloat32:
      return launchPieces<float>(a, stream);
    case kFloat16:
      return launchPieces<fp16_t>(a, stream);
    default:
      return launchPieces<bf16_t>(a, stream);
  }
}

}  // namespace gpu
}  // namespace qcomm
