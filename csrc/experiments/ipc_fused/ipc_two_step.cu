// The fused, persistent two_step over CUDA IPC (Flash Communication's two steps in one kernel).
//
// An experiment (QCOMM_EXPERIMENTS=1 builds only; csrc/experiments/README.md): timed against the
// separate kernels on one H200 it lost, and it stays out of the product until it is timed on two
// or more GPUs and wins.
//
// Each launch handles one piece (fused_layout.h) with a grid of at most one block per SM, so
// every block is resident and no block ever waits for another block of its own launch. A block's
// 8 warps form 8 / taskWarps task groups (QCOMM_IPC_TASK_WARPS; default one group of 8), each
// with its own barrier (__syncthreads, a named barrier, or __syncwarp for one warp), so that the
// groups of one block progress independently. A task group takes tasks in three phases, in this
// order:
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
#define QCOMM_PROTO_FN __device__ __forceinline__
#include "cuda/ipc_sync.cuh"
#include "cuda/launch.cuh"
#include "cuda/tile_codec.cuh"
#include "cuda/warp_codec.cuh"
#include "experiments/ipc_fused/ipc_protocol.h"
#include "experiments/ipc_fused/ipc_two_step.h"

namespace qcomm {
namespace gpu {
namespace {

using ipc::Tile;
using ipc::word;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
static_assert(kWarps == kIpcBlockWarps, "the block's warps are fused_layout.h's");

// loadAcquire, storeRelease and the bounded spin (ipcSpinWait) are csrc/cuda/ipc_sync.cuh's.
#if defined(QCOMM_SIMT)
// the SIMT emulator of the CPU tests
using simt::namedBarrier;
#else
// A named barrier (1..4: the task groups of 2 or 4 warps) with a thread count: the `threads`
// threads (whole warps) that use `id` wait for each other, with __syncthreads' memory ordering
// among them. barrier.sync, not bar.sync (= barrier.sync.aligned): a warp may arrive diverged
// (its leader back from a spin). Literal ids, so that 5 of the 16 hardware barriers are reserved.
__device__ __forceinline__ void namedBarrier(int id, int threads) {
  switch (id) {
    case 1:
      asm volatile("barrier.sync 1, %0;" ::"r"(threads) : "memory");
      break;
    case 2:
      asm volatile("barrier.sync 2, %0;" ::"r"(threads) : "memory");
      break;
    case 3:
      asm volatile("barrier.sync 3, %0;" ::"r"(threads) : "memory");
      break;
    default:
      asm volatile("barrier.sync 4, %0;" ::"r"(threads) : "memory");
  }
}
#endif

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
  float v = 0.0f;
  withCodec(c, [&](auto k) { v = decodeAt<decltype(k)::bits, decltype(k)::sym>(block, n, c, e); });
  return v;
}

// One warp encodes group gi of an n-element block whose values come from value(k), k in the
// group; noise.base is the absolute index of the block's first element.
template <class F>
__device__ void encodeGroup(const CodecSpec& c, int64_t n, int64_t gi, uint8_t* block,
                            const Noise& noise, F value) {
  if (c.bits == 0) {
    const int glen = groupLength(n, c, gi);
    const int64_t begin = gi * c.groupSize;
    for (int k = threadIdx.x % kWarp; k < glen; k += kWarp) {
      rawStore(block, c.rawDtype, begin + k, value(k));
    }
    return;
  }
  withCodec(c, [&](auto k) {
    encodeGroupWarp<decltype(k)::bits, decltype(k)::sym>(block, n, c, gi, noise, value);
  });
}

// The protocol's executor on the GPU: one task group (taskWarps warps of a block), its warps
// encode groups, its first thread spins.
template <class T>
struct DeviceExec {
  const IpcTwoStepArgs& a;
  float* sums;    // shared memory, one codec group per warp of the block
  int* giveUp;    // shared memory, this task group's word
  int tid;        // thread index within the task group
  int threads;    // threads of the task group (whole warps)
  int barrierId;  // the task group's named barrier, when it is neither the block nor one warp

  // an acquire load: the previous launch's advanceEpoch wrote it, and no stale cached copy may
  // stand in for it
  __device__ uint32_t epochBase() const {
    return loadAcquire(word(a.buffers[a.rank], kIpcEpochOffset));
  }
  __device__ void barrier() const {
    if (threads == kThreads) {
      __syncthreads();
    } else if (threads == kWarp) {
      __syncwarp();
    } else {
      namedBarrier(barrierId, threads);
    }
  }

  // QCOMM_IPC_PROFILE: the group's first thread adds the cycles since its previous mark to the
  // phase's counter (host-mapped; the group's other threads have passed the same barrier, or are
  // about to).
  mutable long long lastMark = 0;
  __device__ void mark(int phase) const {
    if (a.profile == nullptr || tid != 0) return;
    const long long now = clock64();
    if (phase >= 0) {
      atomicAdd(a.profile + phase, static_cast<unsigned long long>(now - lastMark));
    } else {
      atomicAdd(a.profile + kIpcPhases, 1ull);
    }
    lastMark = now;
  }
  __device__ bool leader() const { return tid == 0; }
  __device__ void setGiveUp() const { *giveUp = 1; }
  __device__ bool gaveUp() const { return *giveUp != 0; }

  // The group's barrier has ordered its threads' writes of the tile before this (the leader's)
  // release store, and a release is cumulative over them (PTX memory model), so a peer's acquire
  // of the flag sees the whole tile: no fence is needed before it. (A system-scope fence before
  // it, the kernel's until 2026-11-30, lost when timed: benchmarks/results/06.)
  __device__ void release(uint32_t* flag, uint32_t v) const { storeRelease(flag, v); }

  // Spin until *flag == epoch; false when this rank gives up (time-out: recorded, and every
  // rank's abort word set) or a peer already gave up.
  __device__ bool wait(const uint32_t* flag, uint32_t epoch, uint32_t step, int peer,
                       int64_t tile) const {
    return ipcSpinWait(a, flag, epoch, step, peer, tile);
  }

  // Encode a tile of the message with the reduce codec into dst (often a peer's buffer). Whole
  // slabs of 1024 elements go through the codec kernels' slab encoder (16-byte loads, codes
  // stored 4 or 8 bytes per lane, so a warp writes 128 or 256 contiguous bytes at once); the
  // rest, or everything when pointers are misaligned, group by group, one warp per group.
  __device__ void encodeReduce(Tile tile, uint8_t* dst) const {
    constexpr int kVec = 16 / int(sizeof(T));
    const T* x = static_cast<const T*>(a.data) + tile.begin;
    const Noise noise{a.rsNoise.salt, tile.begin, a.rsNoise.on};
    const int64_t groups = numGroups(tile.len, a.rs);
    const int warp = tid / kWarp, warps = threads / kWarp;
    int64_t slabs = 0;
    if (a.rs.bits != 0 && slabGroupSize(a.rs.groupSize, kVec) && aligned(x, 16) &&
        aligned(dst + dataOffset(tile.len, a.rs), kVec * a.rs.bits / 8)) {
      slabs = tile.len / kSlab;
      const SlabTarget t{reinterpret_cast<float*>(dst), dst + dataOffset(tile.len, a.rs), groups,
                         __ffs(a.rs.groupSize) - 1};
      for (int64_t sl = warp; sl < slabs; sl += warps) encodeSlabOf(x, sl * kSlab, t, noise);
    }
    for (int64_t gi = slabs * kSlab / a.rs.groupSize + warp; gi < groups; gi += warps) {
      const T* g = x + gi * a.rs.groupSize;
      encodeGroup(a.rs, tile.len, gi, dst, noise, [&](int k) { return toFloat(g[k]); });
    }
  }

  // One slab, elements base..base+kSlab-1 of x: loaded as tile_codec.cuh lays them out, encoded
  // with the reduce codec.
  __device__ void encodeSlabOf(const T* x, int64_t base, const SlabTarget& t,
                               const Noise& noise) const {
    constexpr int kVec = 16 / int(sizeof(T));
    constexpr int kTile = kWarp * kVec;
    constexpr int kU = kSlab / kTile;
    const int lane = threadIdx.x % kWarp;
    float v[kU][kVec];
#pragma unroll
    for (int j = 0; j < kU; ++j) loadFloats(x + base + j * kTile + lane * kVec, v[j]);
    withCodec(a.rs, [&](auto k) {
      encodeSlab<decltype(k)::bits, decltype(k)::sym, kVec>(v, base, t, noise);
    });
  }

  // Decode the W reduce copies of slot s, sum them in rank order (fp32; AVG divides by W),
  // encode the sum with the gather codec into out. Whole slabs of 1024 elements, when both codecs
  // are quantized with one group size and every copy's codes are word-aligned: one warp per slab,
  // the sums in registers, encoded by the slab encoder (sumEncodeSlab). The rest: one warp per
  // group, the sum built in the warp's shared row (`mine`), copy by copy, then encoded by the
  // warp codec. Both give the same bytes.
  __device__ void sumEncode(Tile tile, int64_t s, uint8_t* out) const {
    uint8_t* own = a.buffers[a.rank];
    const int warp = tid / kWarp, warps = threads / kWarp;
    const int lane = threadIdx.x % kWarp;
    float* mine = sums + (threadIdx.x / kWarp) * a.ag.groupSize;  // this warp's row
    const Noise noise{a.agNoise.salt, tile.begin, a.agNoise.on};
    const int64_t groups = numGroups(tile.len, a.ag);
    // the reduce codec's groups line up with the gather codec's when both have the group size
    const bool byGroup = a.rs.bits != 0 && a.rs.groupSize == a.ag.groupSize;
    int64_t slabs = 0;
    const SlabTarget t{reinterpret_cast<float*>(out), out + dataOffset(tile.len, a.ag), groups,
                       __ffs(a.ag.groupSize) - 1};
    // (one codec for both phases, the usual configuration: 4 kernel variants, not 16)
    if (byGroup && a.ag.bits == a.rs.bits && a.ag.symmetric == a.rs.symmetric &&
        slabGroupSize(a.ag.groupSize, 4) && aligned(t.data, 4 * a.ag.bits / 8) &&
        copiesWordAligned(tile.len, s)) {
      slabs = tile.len / kSlab;
      withCodec(a.rs, [&](auto k) {
        for (int64_t sl = warp; sl < slabs; sl += warps) {
          sumEncodeSlab<decltype(k)>(tile.len, s, sl * kSlab, t, noise);
        }
      });
    }
    for (int64_t gi = slabs * kSlab / a.ag.groupSize + warp; gi < groups; gi += warps) {
      const int glen = groupLength(tile.len, a.ag, gi);
      const int64_t begin = gi * a.ag.groupSize;
      if (byGroup && glen == a.ag.groupSize && sumGroupVec(tile.len, s, gi, mine)) {
        // done: mine holds the group's sum
      } else if (byGroup) {
        for (int q = 0; q < a.world; ++q) {
          addCopy(ipc::reduceSlot(own, a.geometry, q, s), tile.len, gi, glen, mine, q == 0);
        }
        if (a.average) {
          for (int k = lane; k < glen; k += kWarp) mine[k] = mine[k] / float(a.world);
        }
      } else {
        for (int k = lane; k < glen; k += kWarp) {
          float acc = decodeElem(ipc::reduceSlot(own, a.geometry, 0, s), tile.len, a.rs, begin + k);
          for (int q = 1; q < a.world; ++q) {
            acc =
                acc + decodeElem(ipc::reduceSlot(own, a.geometry, q, s), tile.len, a.rs, begin + k);
          }
          mine[k] = a.average ? acc / float(a.world) : acc;
        }
      }
      __syncwarp();
      encodeGroup(a.ag, tile.len, gi, out, noise, [&](int k) { return mine[k]; });
      __syncwarp();
    }
  }

  // Whether every reduce copy of slot s (blocks of n elements) has its codes aligned for the
  // word loads of loadCodes4 (4 bytes at 8 bits, 2 at 4).
  __device__ bool copiesWordAligned(int64_t n, int64_t s) const {
    bool ok = true;
    for (int q = 0; q < a.world; ++q) {
      const uint8_t* block = ipc::reduceSlot(a.buffers[a.rank], a.geometry, q, s);
      ok = ok && aligned(block + dataOffset(n, a.rs), a.rs.bits / 2);
    }
    return ok;
  }

  // The slab [base, base + kSlab) of slot s (K: the codec variant of both phases, one group
  // size): lane l holds, for each vector j, elements base + 128 j + 4 l .. + 3 (the slab layout of
  // tile_codec.cuh with 4 elements per vector), each the sum of the W copies' decoded codes in
  // rank order 0..W-1 (AVG divides by W), the operations of sumGroupVec in its order; encodeSlab
  // then encodes the slab as encodeGroup would encode its groups, bit for bit. Copy by copy, each
  // copy's 8 code words and parameters loaded before they are added.
  template <class K>
  __device__ void sumEncodeSlab(int64_t n, int64_t s, int64_t base, const SlabTarget& t,
                                const Noise& noise) const {
    constexpr int kVec = 4;
    constexpr int kTile = kWarp * kVec;
    constexpr int kU = kSlab / kTile;
    const int64_t rsGroups = numGroups(n, a.rs);
    const int lane = threadIdx.x % kWarp;
    float v[kU][kVec];
    for (int q = 0; q < a.world; ++q) {
      const uint8_t* block = ipc::reduceSlot(a.buffers[a.rank], a.geometry, q, s);
      const uint8_t* data = block + dataOffset(n, a.rs);
      const float* meta = reinterpret_cast<const float*>(block);
      uint32_t c[kU][4];
      GroupParams p[kU];
#pragma unroll
      for (int j = 0; j < kU; ++j) {
        const int64_t e = base + j * kTile + lane * kVec;
        loadCodes4<K::bits>(data, e, c[j]);
        p[j] = loadParamsAt<K::sym>(meta, rsGroups, e >> t.groupShift);
      }
#pragma unroll
      for (int j = 0; j < kU; ++j) {
        float d[kVec];
        dequantize4<K::bits, K::sym>(c[j], p[j], d);
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[j][k] = q == 0 ? d[k] : v[j][k] + d[k];
      }
    }
    if (a.average) {
      const float w = float(a.world);
#pragma unroll
      for (int j = 0; j < kU; ++j) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[j][k] = v[j][k] / w;
      }
    }
    encodeSlab<K::bits, K::sym, kVec>(v, base, t, noise);
  }

  // The sum of the W reduce copies of a whole group gi of slot s into mine (the AVG division
  // included), lane l taking items of 4 elements l, l + 32, ...: the W code words of an item are
  // loaded together, then added in rank order 0..W-1 (the operations addCopy does, in its order).
  // False, with nothing written, when a copy's codes are not aligned for word loads.
  __device__ bool sumGroupVec(int64_t n, int64_t s, int64_t gi, float* mine) const {
    uint8_t* own = a.buffers[a.rank];
    const int64_t begin = gi * a.rs.groupSize;
    const uint8_t* data[kIpcMaxRanks];
    GroupParams p[kIpcMaxRanks];
    bool ok = true;
#pragma unroll
    for (int q = 0; q < kIpcMaxRanks; ++q) {
      if (q < a.world) {
        const uint8_t* block = ipc::reduceSlot(own, a.geometry, q, s);
        data[q] = block + dataOffset(n, a.rs);
        ok = ok && aligned(data[q] + begin * a.rs.bits / 8, a.rs.bits / 2);
        p[q] = loadParams(block, n, a.rs, gi);
      }
    }
    if (!ok) return false;
    const int lane = threadIdx.x % kWarp;
    const int items = a.rs.groupSize / 4;
    const float w = float(a.world);
    withCodec(a.rs, [&](auto kc) {
      using K = decltype(kc);
      for (int i = lane; i < items; i += kWarp) {
        uint32_t c[kIpcMaxRanks][4];
#pragma unroll
        for (int q = 0; q < kIpcMaxRanks; ++q) {
          if (q < a.world) loadCodes4<K::bits>(data[q], begin + 4 * i, c[q]);
        }
        float acc[4];
        dequantize4<K::bits, K::sym>(c[0], p[0], acc);
#pragma unroll
        for (int q = 1; q < kIpcMaxRanks; ++q) {
          if (q < a.world) {
            float d[4];
            dequantize4<K::bits, K::sym>(c[q], p[q], d);
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[j] = acc[j] + d[j];
          }
        }
        if (a.average) {
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[j] = acc[j] / w;
        }
        *reinterpret_cast<float4*>(mine + 4 * i) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      }
    });
    return true;
  }

  // mine[k] = x^[k] (first) or mine[k] + x^[k] for the elements k of group gi of one reduce copy
  // (an encoded block of n elements with the reduce codec); lane l takes k = l, l + 32, ...
  __device__ void addCopy(const uint8_t* block, int64_t n, int64_t gi, int glen, float* mine,
                          bool first) const {
    const GroupParams p = loadParams(block, n, a.rs, gi);
    const uint8_t* data = block + dataOffset(n, a.rs);
    const int64_t begin = gi * a.rs.groupSize;
    withCodec(a.rs, [&](auto kc) {
      using K = decltype(kc);
      for (int k = threadIdx.x % kWarp; k < glen; k += kWarp) {
        const float v = dequantizeOne<K::bits, K::sym>(codeAt<K::bits>(data, begin + k), p);
        mine[k] = first ? v : mine[k] + v;
      }
    });
  }

  __device__ void copy16(uint8_t* dst, const uint8_t* src, int64_t vectors) const {
    const int4* from = reinterpret_cast<const int4*>(src);
    int4* to = reinterpret_cast<int4*>(dst);
    for (int64_t v = tid; v < vectors; v += threads) to[v] = from[v];
  }

  // The output elements of a tile from its gather bytes (an encoded block of tile.len elements),
  // one element per thread and step; the block's layout is computed once, not per element.
  __device__ void decodeOut(const uint8_t* src, Tile tile) const {
    T* x = static_cast<T*>(a.data) + tile.begin;
    if (a.ag.bits == 0) {
      for (int64_t e = tid; e < tile.len; e += threads) {
        x[e] = fromFloat<T>(rawLoad(src, a.ag.rawDtype, e));
      }
      return;
    }
    const float* meta = reinterpret_cast<const float*>(src);
    const int64_t groups = numGroups(tile.len, a.ag);
    const uint8_t* data = src + dataOffset(tile.len, a.ag);
    const int shift = __ffs(a.ag.groupSize) - 1;  // group sizes are powers of two
    // items of 4 consecutive elements (one code word, one 4-element store), kDecodeItems per
    // thread with every load issued before the first use: a tile takes one memory round trip,
    // not one per element
    constexpr int kDecodeItems = 4;
    const bool vec = aligned(x, 4 * int(sizeof(T))) && aligned(data, a.ag.bits / 2);
    const int64_t items = vec ? tile.len / 4 : 0;
    withCodec(a.ag, [&](auto k) {
      using K = decltype(k);
      for (int64_t first = tid; first < items; first += kDecodeItems * threads) {
        uint32_t q[kDecodeItems][4];
        GroupParams p[kDecodeItems];
        loadItems<K::bits, K::sym>(data, meta, groups, shift, first, threads, items, q, p);
#pragma unroll
        for (int u = 0; u < kDecodeItems; ++u) {
          const int64_t i = first + u * threads;
          if (i < items) {
            float v[4];
            dequantize4<K::bits, K::sym>(q[u], p[u], v);
            storeFloats(x + 4 * i, v);
          }
        }
      }
      for (int64_t e = 4 * items + tid; e < tile.len; e += threads) {
        const GroupParams p = loadParamsAt<K::sym>(meta, groups, e >> shift);
        x[e] = fromFloat<T>(dequantizeOne<K::bits, K::sym>(codeAt<K::bits>(data, e), p));
      }
    });
  }
};

// At most one block per SM is ever launched, so the register budget is one block's (no spills).
// Task group g of block b is the protocol's block b * groups + g of gridDim.x * groups.
template <class T>
__global__ void __launch_bounds__(kThreads, 1) twoStepPiece(IpcTwoStepArgs a, int64_t piece) {
  __shared__ __align__(16) float sums[kWarps * 1024];
  __shared__ int giveUp[kWarps];
  const int groupThreads = a.taskWarps * kWarp;
  const int groups = kThreads / groupThreads;
  const int group = int(threadIdx.x) / groupThreads;
  if (threadIdx.x < kWarps) giveUp[threadIdx.x] = 0;
  __syncthreads();
  DeviceExec<T> ex{
      a, sums, &giveUp[group], int(threadIdx.x) - group * groupThreads, groupThreads, 1 + group};
  ipc::runPiece(ex, a, piece, int64_t(blockIdx.x) * groups + group, int64_t(gridDim.x) * groups);
}

__global__ void advanceEpoch(uint8_t* own, uint32_t pieces) {
  *word(own, kIpcEpochOffset) += pieces;
}

template <class T>
cudaError_t launchPieces(const IpcTwoStepArgs& a, cudaStream_t stream) {
  const IpcGeometry& g = a.geometry;
  const int groups = kWarps / a.taskWarps;  // task groups per block
  for (int64_t p = 0; p < g.pieces; ++p) {
    const int64_t tasks = pieceSlots(g, p) * (a.world > 1 ? a.world - 1 : 1);
    const int64_t need = (tasks + groups - 1) / groups;
    int blocks = int(need < a.smCount ? need : a.smCount);
    blocks = blocks > 1 ? blocks : 1;
    QCOMM_LAUNCH(twoStepPiece<T>, blocks, kThreads, stream)(a, p);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  QCOMM_LAUNCH(advanceEpoch, 1, 1, stream)(a.buffers[a.rank], uint32_t(g.pieces));
  return cudaGetLastError();
}

}  // namespace

cudaError_t ipcTwoStepPreload() {
#if defined(QCOMM_SIMT)
  return cudaSuccess;
#else
  // Referencing a kernel loads it (under lazy loading, CUDA 12.2+'s default, a kernel is loaded
  // at its first launch, and loading waits for the context's running kernels). Ranks that are
  // threads of one process share a context: a rank that loaded advanceEpoch, or a piece kernel,
  // while its peer's piece kernel spins waiting for this rank would wait for that kernel, and
  // that kernel for this rank's launch. So every kernel here is loaded at set-up (the separate
  // kernels by gpu::ipcPreload).
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, twoStepPiece<float>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, twoStepPiece<fp16_t>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, twoStepPiece<bf16_t>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, advanceEpoch);
  return e;
#endif
}

cudaError_t ipcTwoStep(const IpcTwoStepArgs& a, cudaStream_t stream) {
  if (a.numel == 0 || a.geometry.pieces == 0) return cudaSuccess;
  if (a.taskWarps < 1 || a.taskWarps > kWarps || (kWarps % a.taskWarps) != 0) {
    return cudaErrorInvalidValue;
  }
  // an error left pending by earlier, unrelated work must not pass for a failure of these
  // launches (which would stop before the epoch advance)
  (void)cudaGetLastError();
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
