// CUDA codec kernels over csrc/codec/codec.h. Encoding: one warp per slab of 1024 elements (a whole
// number of groups), each element loaded once into registers with 16-byte loads, the groups'
// min/max/absmax reduced across lanes, the codes written with wide stores (tile_codec.cuh).
// Decoding: one thread per 4 consecutive elements (one code word in, one float4 out). Unaligned
// pointers and the last, partial slab take the scalar paths (one warp per group, one thread per
// element; warp_codec.cuh). Grids are sized to the chip and grid-stride, so any numel works; the
// launch choices (grid, encoder blocks per SM) are cuda/tuning.h's.
#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/codec_kernels.h"
#include "cuda/launch.cuh"
#include "cuda/tile_codec.cuh"
#include "cuda/tuning.h"
#include "cuda/warp_codec.cuh"

namespace qcomm {
namespace gpu {
namespace {

constexpr int kBlock = 256;       // 8 warps per block
constexpr int kDecodeUnroll = 4;  // float4 items per thread and loop step of the decoder

// Zero the padding between metadata and data (block 0 only), so every byte is determined.
__device__ __forceinline__ void zeroPadding(uint8_t* block, int64_t n, const CodecSpec& c) {
  if (blockIdx.x == 0) {
    for (int64_t i = metaBytes(n, c) + threadIdx.x; i < dataOffset(n, c); i += blockDim.x) {
      block[i] = 0;
    }
  }
}

__device__ __forceinline__ int64_t globalWarp() {
  return (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
}

__device__ __forceinline__ int64_t warpsInGrid() {
  return int64_t(gridDim.x) * (blockDim.x / kWarp);
}

// kMinBlocks blocks per SM (which one a launch takes: tuning::encodeBlocks). 3: at most 85
// registers, where the asymmetric fp32 and bf16 encoders once took 89-105 and so fit only 2 (16
// warps of a slab's loads each in flight, not 24); with encodeSlab's reduce-scatter they take
// 69-80 and spill nothing. 4: at most 64 registers, 32 warps, a third more slabs' loads in
// flight, at the price of spills in most variants (not in fp32 symmetric ones).
template <class T, int kBits, bool kSym, int kMinBlocks>
__global__ void __launch_bounds__(kBlock, kMinBlocks)
    encodeKernel(const T* x, int64_t n, CodecSpec c, uint8_t* block, Noise noise) {
  constexpr int kVec = 16 / int(sizeof(T));  // one 16-byte load per lane and vector
  constexpr int kTile = kWarp * kVec;
  constexpr int kU = kSlab / kTile;
  zeroPadding(block, n, c);
  const SlabTarget t{reinterpret_cast<float*>(block), block + dataOffset(n, c), numGroups(n, c),
                     __ffs(c.groupSize) - 1};
  const int lane = threadIdx.x % kWarp;
  const bool vec =
      slabGroupSize(c.groupSize, kVec) && aligned(x, 16) && aligned(t.data, kVec * kBits / 8);
  if (!vec) {
    for (int64_t g = globalWarp(); g < t.groups; g += warpsInGrid()) {
      const T* xg = x + g * c.groupSize;
      encodeGroupWarp<kBits, kSym>(block, n, c, g, noise, [&](int k) { return toFloat(xg[k]); });
    }
    return;
  }
  const int64_t slabs = (n + kSlab - 1) / kSlab;
  for (int64_t s = globalWarp(); s < slabs; s += warpsInGrid()) {
    const int64_t base = s * kSlab;
    if (base + kSlab <= n) {
      float v[kU][kVec];
#pragma unroll
      for (int j = 0; j < kU; ++j) loadFloats(x + base + j * kTile + lane * kVec, v[j]);
      encodeSlab<kBits, kSym, kVec>(v, base, t, noise);
    } else {  // the last, partial slab: its groups one by one
      for (int64_t g = base >> t.groupShift; g < t.groups; ++g) {
        const T* xg = x + g * c.groupSize;
        encodeGroupWarp<kBits, kSym>(block, n, c, g, noise, [&](int k) { return toFloat(xg[k]); });
      }
    }
  }
}

template <class T, class R>
__global__ void castKernel(const T* x, int64_t n, R* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    out[i] = fromFloat<R>(toFloat(x[i]));
  }
}

template <class T>
__global__ void rawToFloatKernel(const T* x, int64_t n, float* out, bool accumulate) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = toFloat(x[i]);
    out[i] = accumulate ? out[i] + v : v;
  }
}

// x[i] = x[i] / divisor (AVG's division of a sum by the world size): an IEEE fp32 division (the
// build's --prec-div=true), as the CPU's divideBy, bit for bit.
__global__ void divideKernel(float* x, int64_t n, float divisor) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = x[i] / divisor;
}

// x[i] = x[i] * factor (a reduce-scatter's PREMUL_SUM factor, applied to the fp32 sum): one IEEE
// fp32 product, as the CPU's multiplyBy, bit for bit.
__global__ void multiplyKernel(float* x, int64_t n, float factor) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] = x[i] * factor;
}

// Item i is elements 4i..4i+3 (one group: groupSize is a multiple of 4). Each loop step of a
// block covers kUnroll * kBlock consecutive items, thread t items t, t + kBlock, ..., so every
// load and store instruction of a warp touches one contiguous range.
template <int kBits, bool kSym>
__global__ void __launch_bounds__(kBlock)
    decodeKernel(const uint8_t* block, int64_t n, CodecSpec c, float* out, bool accumulate) {
  constexpr int kUnroll = kDecodeUnroll;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = int64_t(gridDim.x) * blockDim.x;
  const float* meta = reinterpret_cast<const float*>(block);
  const int64_t groups = numGroups(n, c);
  const uint8_t* data = block + dataOffset(n, c);
  const int shift = __ffs(c.groupSize) - 1;
  const bool vec = slabGroupSize(c.groupSize, 4) && aligned(out, 16) && aligned(data, kBits / 2);
  const int64_t items = vec ? n / 4 : 0;
  const int64_t step = int64_t(gridDim.x) * (kBlock * kUnroll);
  constexpr int kStepItems = kBlock * kUnroll;  // a step's items of 4 codes
  for (int64_t first = int64_t(blockIdx.x) * kStepItems + threadIdx.x; first < items;
       first += step) {
    // a whole step (every step of the grid but the last ones) needs no bound per item, and its
    // items' groups are g0 + u * (4 kBlock >> shift): 4 kBlock = 1024 elements is a multiple of
    // every group size, so one shift serves the step
    const bool whole = first + (kUnroll - 1) * kBlock < items;
    auto decodeStep = [&](auto wholeStep) {
      constexpr bool kWhole = decltype(wholeStep)::value;
      uint32_t q[kUnroll][4];
      GroupParams p[kUnroll];
      if (kWhole) {
        const int64_t g0 = (4 * first) >> shift;
        const int gStep = (4 * kBlock) >> shift;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          loadCodes4<kBits>(data, 4 * (first + u * kBlock), q[u]);
          p[u] = loadParamsAt<kSym>(meta, groups, g0 + u * gStep);
        }
      } else {
        loadItems<kBits, kSym>(data, meta, groups, shift, first, kBlock, items, q, p);
      }
      // one test for the step, without branches: when every item's group decodes finite
      // (decodesFinite, the common case) clampToFinite is the identity and is skipped, a clamp
      // per element fewer
      bool finite = true;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        finite &= (!kWhole && first + u * kBlock >= items) | decodesFinite<kSym>(p[u]);
      }
      auto items4 = [&](auto decodeCode) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t i = first + u * kBlock;
          if (kWhole || i < items) {
            float4 v;
            v.x = decodeCode(q[u][0], p[u]);
            v.y = decodeCode(q[u][1], p[u]);
            v.z = decodeCode(q[u][2], p[u]);
            v.w = decodeCode(q[u][3], p[u]);
            float4* o = reinterpret_cast<float4*>(out) + i;
            if (accumulate) {
              const float4 a = *o;
              v.x = a.x + v.x;
              v.y = a.y + v.y;
              v.z = a.z + v.z;
              v.w = a.w + v.w;
            }
            *o = v;
          }
        }
      };
      if (finite) {
        items4([](uint32_t c, const GroupParams& g) {
          return dequantizeUnclamped<kBits, kSym>(c, g);
        });
      } else {
        items4([](uint32_t c, const GroupParams& g) { return dequantizeOne<kBits, kSym>(c, g); });
      }
    };
    if (whole) {
      decodeStep(std::true_type{});
    } else {
      decodeStep(std::false_type{});
    }
  }
  // the scalar path: elements past the last whole item, or all of them when unaligned
  for (int64_t e = 4 * items + tid; e < n; e += threads) {
    const float v = decodeAt<kBits, kSym>(block, n, c, e);
    out[e] = accumulate ? out[e] + v : v;
  }
}

// out = d_0 + d_1 + ... + d_{count-1} (out = out + d_0 + ... with accumulate), d_k the decoded
// values of the k-th of `count` encoded blocks of the same n elements and codec, summed in that
// order in fp32: the values of decodeKernel's first call and accumulating calls after it, with
// the sum kept in registers instead of written and read back once per block. Item i is elements
// 4i..4i+3, one per thread and loop step, every block's loads issued before the first use.
template <int kBits, bool kSym>
__global__ void __launch_bounds__(kBlock)
    decodeSumKernel(SumSources s, int64_t n, CodecSpec c, float* out, bool accumulate) {
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = int64_t(gridDim.x) * blockDim.x;
  const int64_t groups = numGroups(n, c);
  const int64_t data = dataOffset(n, c);
  const int shift = __ffs(c.groupSize) - 1;
  // every index into s is a constant (unrolled loops): a dynamic one would copy s to local memory
  bool vec = slabGroupSize(c.groupSize, 4) && aligned(out, 16);
#pragma unroll
  for (int k = 0; k < kMaxSumSources; ++k) {
    if (k < s.count) vec = vec && aligned(s.block[k] + data, kBits / 2);
  }
  const int64_t items = vec ? n / 4 : 0;
  for (int64_t i = tid; i < items; i += threads) {
    uint32_t q[kMaxSumSources][4];
    GroupParams p[kMaxSumSources];
    const int64_t g = (4 * i) >> shift;
#pragma unroll
    for (int k = 0; k < kMaxSumSources; ++k) {
      if (k < s.count) {
        loadCodes4<kBits>(s.block[k] + data, 4 * i, q[k]);
        p[k] = loadParamsAt<kSym>(reinterpret_cast<const float*>(s.block[k]), groups, g);
      }
    }
    float4* o = reinterpret_cast<float4*>(out) + i;
    float acc[4];
    dequantize4<kBits, kSym>(q[0], p[0], acc);
    if (accumulate) {
      const float4 a = *o;
      acc[0] = a.x + acc[0];
      acc[1] = a.y + acc[1];
      acc[2] = a.z + acc[2];
      acc[3] = a.w + acc[3];
    }
#pragma unroll
    for (int k = 1; k < kMaxSumSources; ++k) {
      if (k < s.count) {
        float d[4];
        dequantize4<kBits, kSym>(q[k], p[k], d);
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[j] = acc[j] + d[j];
      }
    }
    *o = make_float4(acc[0], acc[1], acc[2], acc[3]);
  }
  // the scalar path: elements past the last whole item, or all of them when unaligned
  for (int64_t e = 4 * items + tid; e < n; e += threads) {
    float acc = decodeAt<kBits, kSym>(s.block[0], n, c, e);
    if (accumulate) acc = out[e] + acc;
#pragma unroll
    for (int k = 1; k < kMaxSumSources; ++k) {
      if (k < s.count) acc = acc + decodeAt<kBits, kSym>(s.block[k], n, c, e);
    }
    out[e] = acc;
  }
}

// partial = decode(src) + local, then encode partial (both codecs share the group size). The
// vector path is encodeKernel's with the slab's values computed instead of loaded: one float4 of
// partial per lane and vector (kVec = 4), written as it is computed.
template <class T, int kInBits, bool kInSym, int kOutBits, bool kOutSym>
__global__ void __launch_bounds__(kBlock, 2)
    hopKernel(const uint8_t* src, CodecSpec in, const T* local, int64_t n, float* partial,
              CodecSpec out, uint8_t* dst, Noise noise) {
  constexpr int kVec = 4;
  constexpr int kTile = kWarp * kVec;
  constexpr int kU = kSlab / kTile;
  zeroPadding(dst, n, out);
  const SlabTarget t{reinterpret_cast<float*>(dst), dst + dataOffset(n, out), numGroups(n, out),
                     __ffs(out.groupSize) - 1};
  const float* inMeta = reinterpret_cast<const float*>(src);
  const int64_t inGroups = numGroups(n, in);
  const uint8_t* inData = src + dataOffset(n, in);
  const int lane = threadIdx.x % kWarp;
  const bool vec = slabGroupSize(out.groupSize, kVec) && in.groupSize == out.groupSize &&
                   aligned(inData, kVec * kInBits / 8) && aligned(local, kVec * int(sizeof(T))) &&
                   aligned(partial, 16) && aligned(t.data, kVec * kOutBits / 8);
  // the scalar path of group g: partial first, then the group is encoded from it
  auto scalarGroup = [&](int64_t g) {
    const int64_t begin = g * out.groupSize;
    const int len = groupLength(n, out, g);
    for (int k = lane; k < len; k += kWarp) {
      const float d = decodeAt<kInBits, kInSym>(src, n, in, begin + k);
      partial[begin + k] = d + toFloat(local[begin + k]);
    }
    __syncwarp();
    const float* pg = partial + begin;
    encodeGroupWarp<kOutBits, kOutSym>(dst, n, out, g, noise, [&](int k) { return pg[k]; });
  };
  if (!vec) {
    for (int64_t g = globalWarp(); g < t.groups; g += warpsInGrid()) scalarGroup(g);
    return;
  }
  const int64_t slabs = (n + kSlab - 1) / kSlab;
  for (int64_t s = globalWarp(); s < slabs; s += warpsInGrid()) {
    const int64_t base = s * kSlab;
    if (base + kSlab <= n) {
      // every load of the slab first (partial may alias local: each element is read before the
      // same lane writes it), then the sums
      uint32_t q[kU][kVec];
      GroupParams p[kU];
      float v[kU][kVec];
#pragma unroll
      for (int j = 0; j < kU; ++j) {
        const int64_t e = base + j * kTile + lane * kVec;
        loadCodes4<kInBits>(inData, e, q[j]);
        p[j] = loadParamsAt<kInSym>(inMeta, inGroups, e >> t.groupShift);
        loadFloats(local + e, v[j]);
      }
#pragma unroll
      for (int j = 0; j < kU; ++j) {
        const int64_t e = base + j * kTile + lane * kVec;
        float d[kVec];
        dequantize4<kInBits, kInSym>(q[j], p[j], d);
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[j][k] = d[k] + v[j][k];
        *reinterpret_cast<float4*>(partial + e) = make_float4(v[j][0], v[j][1], v[j][2], v[j][3]);
      }
      encodeSlab<kOutBits, kOutSym, kVec>(v, base, t, noise);
    } else {  // the last, partial slab: its groups one by one
      for (int64_t g = base >> t.groupShift; g < t.groups; ++g) scalarGroup(g);
    }
  }
}

// ---- the rotated codec (QuantConfig.rotate): whole groups, one warp per group ----
//
// Each warp loads a group into registers (warp_codec.cuh's lane layout), rotates it there and
// quantizes it, or decodes it there and rotates it back: one pass over memory, as the CPU's
// encodeRotatedGroup and decodeRotatedGroup do through a local buffer.

// v = float(x[begin..begin + 32 per)) in the lane's registers.
template <class T>
__device__ __forceinline__ void loadGroupRegisters(const T* x, int64_t begin, int per,
                                                   float (&v)[kMaxPerLane]) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    v[j] = j < per ? toFloat(x[begin + j * kWarp + lane]) : 0.0f;
  }
}

// The encoded block of H x per group (codec.h encodeRotatedGroup), n a multiple of the group.
template <class T, int kBits, bool kSym>
__global__ void __launch_bounds__(kBlock)
    encodeRotatedKernel(const T* x, int64_t n, CodecSpec c, uint8_t* block, Noise noise) {
  zeroPadding(block, n, c);
  const int per = c.groupSize / kWarp;
  const int64_t groups = n / c.groupSize;
  for (int64_t g = globalWarp(); g < groups; g += warpsInGrid()) {
    float v[kMaxPerLane];
    loadGroupRegisters(x, g * c.groupSize, per, v);
    warpHadamard(v, per);
    encodeRegistersWarp<kBits, kSym>(v, per, block, n, c, g, noise);
  }
}

// out = H x^ / g per group (codec.h decodeRotatedGroup).
template <int kBits, bool kSym>
__global__ void __launch_bounds__(kBlock)
    decodeRotatedKernel(const uint8_t* block, int64_t n, CodecSpec c, float* out) {
  const int lane = threadIdx.x % kWarp;
  const int per = c.groupSize / kWarp;
  const int64_t groups = n / c.groupSize;
  const uint8_t* data = block + dataOffset(n, c);
  const float inv = 1.0f / float(c.groupSize);  // a power of two: exact
  for (int64_t g = globalWarp(); g < groups; g += warpsInGrid()) {
    const int64_t begin = g * c.groupSize;
    const GroupParams p = loadParams(block, n, c, g);
    float v[kMaxPerLane];
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      v[j] = j < per ? dequantizeOne<kBits, kSym>(codeAt<kBits>(data, begin + j * kWarp + lane), p)
                     : 0.0f;
    }
    warpHadamard(v, per);
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      if (j < per) out[begin + j * kWarp + lane] = v[j] * inv;
    }
  }
}

// out = R(H float(x)) per group, or with kInverse R(H float(x) / g): rotateToFloat (R = float;
// out may be x, as each lane reads its elements before it writes them), the raw rotated encode
// (R = the raw dtype) and the raw rotated decode (kInverse).
template <class T, class R, bool kInverse>
__global__ void __launch_bounds__(kBlock)
    rotateKernel(const T* x, int64_t n, int groupSize, R* out) {
  const int lane = threadIdx.x % kWarp;
  const int per = groupSize / kWarp;
  const int64_t groups = n / groupSize;
  const float inv = 1.0f / float(groupSize);
  for (int64_t g = globalWarp(); g < groups; g += warpsInGrid()) {
    const int64_t begin = g * groupSize;
    float v[kMaxPerLane];
    loadGroupRegisters(x, begin, per, v);
    warpHadamard(v, per);
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      if (j < per) out[begin + j * kWarp + lane] = fromFloat<R>(kInverse ? v[j] * inv : v[j]);
    }
  }
}

}  // namespace

int balancedGrid(int64_t needed, int64_t cap) {
  if (needed < 1) return 1;
  if (cap < 1) cap = 1;
  const int64_t turns = (needed + cap - 1) / cap;
  return int((needed + turns - 1) / turns);
}

namespace {

// Blocks to launch: what the work needs, at most what the chip holds at once (the kernels are
// grid-stride), and, when the work takes several turns of the grid, about the same number of turns
// for every block (balancedGrid): ceil(needed / turns) blocks rather than the whole chip, so no
// last turn runs with a fraction of the grid (64 MiB of fp32: 16384 slabs over 3168 resident
// warps were 5.17 turns, so six, the last 17% full; now 2736 warps take six or five). The
// resident count per SM is computed once per kernel.
template <auto kKernel>
int gridFor(int64_t blocksNeeded) {
  static const int perSm = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kKernel, kBlock, 0) != cudaSuccess) {
      (void)cudaGetLastError();  // only our own query failed; fall back to a guess
      b = 2048 / kBlock;
    }
    return b > 0 ? b : 1;
  }();
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      sms <= 0) {
    (void)cudaGetLastError();
    sms = 132;
  }
  return balancedGrid(blocksNeeded, int64_t(sms) * perSm);
}

int64_t slabBlocks(int64_t n) {
  const int64_t warps = (n + kSlab - 1) / kSlab;
  return (warps + kBlock / kWarp - 1) / (kBlock / kWarp);
}

int64_t elementBlocks(int64_t n, int perThread) {
  return (n + int64_t(kBlock) * perThread - 1) / (int64_t(kBlock) * perThread);
}

// full: the full grid, every block the work needs, each taking one turn of its loop, the hardware
// starting blocks as others finish; else the resident, balanced grid (gridFor). The same bytes
// either way, as every kernel is grid-stride; which one a launch takes: tuning::fullGrid.
template <auto kKernel, class... Args>
void launch(int64_t blocksNeeded, bool full, cudaStream_t s, Args... args) {
  const int grid = full ? int(std::min<int64_t>(std::max<int64_t>(blocksNeeded, 1), INT_MAX))
                        : gridFor<kKernel>(blocksNeeded);
  QCOMM_LAUNCH(kKernel, grid, kBlock, s)(args...);
}

// The tuned choices for the launches other than the decoder and the encoders (tuning.h).
bool otherFullGrid(int64_t n) { return tuning::fullGrid(tuning::Launch::kOther, n); }

template <class T>
constexpr int32_t elementDtype() {
  return std::is_same<T, float>::value ? kFloat32
                                       : (std::is_same<T, fp16_t>::value ? kFloat16 : kBFloat16);
}

template <class T>
void launchEncode(const T* x, int64_t n, const CodecSpec& c, uint8_t* dst, const Noise& noise,
                  cudaStream_t s) {
  const bool four = tuning::encodeBlocks(elementDtype<T>(), c.bits, c.symmetric != 0) == 4;
  const bool full = tuning::fullGrid(four ? tuning::Launch::kEncode4 : tuning::Launch::kEncode3, n);
  withCodec(c, [&](auto k) {
    using K = decltype(k);
    if (four) {
      launch<encodeKernel<T, K::bits, K::sym, 4>>(slabBlocks(n), full, s, x, n, c, dst, noise);
    } else {
      launch<encodeKernel<T, K::bits, K::sym, 3>>(slabBlocks(n), full, s, x, n, c, dst, noise);
    }
  });
}

template <class T>
void launchCast(const T* x, int64_t n, int32_t to, void* out, cudaStream_t s) {
  const int64_t blocks = elementBlocks(n, 1);
  const bool full = otherFullGrid(n);
  if (to == kFloat32)
    launch<castKernel<T, float>>(blocks, full, s, x, n, static_cast<float*>(out));
  else if (to == kFloat16)
    launch<castKernel<T, fp16_t>>(blocks, full, s, x, n, static_cast<fp16_t*>(out));
  else
    launch<castKernel<T, bf16_t>>(blocks, full, s, x, n, static_cast<bf16_t*>(out));
}

template <class T>
void launchRawToFloat(const T* x, int64_t n, float* out, bool accumulate, cudaStream_t s) {
  launch<rawToFloatKernel<T>>(elementBlocks(n, 1), otherFullGrid(n), s, x, n, out, accumulate);
}

template <class T>
void launchHop(const uint8_t* src, const CodecSpec& in, const T* local, int64_t n, float* partial,
               const CodecSpec& out, uint8_t* dst, const Noise& noise, cudaStream_t s) {
  withCodec(in, [&](auto ki) {
    withCodec(out, [&](auto ko) {
      using I = decltype(ki);
      using O = decltype(ko);
      launch<hopKernel<T, I::bits, I::sym, O::bits, O::sym>>(
          slabBlocks(n), otherFullGrid(n), s, src, in, local, n, partial, out, dst, noise);
    });
  });
}

// f(T{}) for the element type of `dtype` (fp32, fp16 or bf16).
template <class F>
void withElements(int32_t dtype, F&& f) {
  switch (dtype) {
    case kFloat32:
      f(float{});
      break;
    case kFloat16:
      f(fp16_t{});
      break;
    default:
      f(bf16_t{});
  }
}

// The rotated kernels hold a group in one warp's registers: whole groups of 32..1024 (a power of
// two), as the plan pads them; anything else is a caller's bug, refused as the CPU's is.
void requireRotatable(int64_t n, int groupSize, const char* what) {
  if (groupSize < kWarp || groupSize > kMaxGroupSize || (groupSize & (groupSize - 1)) != 0 ||
      n % groupSize != 0) {
    throw std::invalid_argument(std::string("qcomm: ") + what + " of " + std::to_string(n) +
                                " elements: rotated blocks hold whole groups of " +
                                std::to_string(groupSize) + " (a power of two, 32 to 1024)");
  }
}

// Blocks of kBlock / kWarp warps for one warp per group.
int64_t groupBlocks(int64_t n, int groupSize) {
  const int64_t warpsPerBlock = kBlock / kWarp;
  return (n / groupSize + warpsPerBlock - 1) / warpsPerBlock;
}

}  // namespace

cudaError_t encode(const void* x, int32_t dtype, int64_t n, const CodecSpec& c, uint8_t* dst,
                   const Noise& noise, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (c.bits == 0) {
    switch (dtype) {
      case kFloat32:
        launchCast(static_cast<const float*>(x), n, c.rawDtype, dst, stream);
        break;
      case kFloat16:
        launchCast(static_cast<const fp16_t*>(x), n, c.rawDtype, dst, stream);
        break;
      default:
        launchCast(static_cast<const bf16_t*>(x), n, c.rawDtype, dst, stream);
    }
    return cudaGetLastError();
  }
  switch (dtype) {
    case kFloat32:
      launchEncode(static_cast<const float*>(x), n, c, dst, noise, stream);
      break;
    case kFloat16:
      launchEncode(static_cast<const fp16_t*>(x), n, c, dst, noise, stream);
      break;
    default:
      launchEncode(static_cast<const bf16_t*>(x), n, c, dst, noise, stream);
  }
  return cudaGetLastError();
}

cudaError_t decode(const uint8_t* src, int64_t n, const CodecSpec& c, float* out, bool accumulate,
                   cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (c.bits == 0) {
    if (c.rawDtype == kFloat32)
      launchRawToFloat(reinterpret_cast<const float*>(src), n, out, accumulate, stream);
    else if (c.rawDtype == kFloat16)
      launchRawToFloat(reinterpret_cast<const fp16_t*>(src), n, out, accumulate, stream);
    else
      launchRawToFloat(reinterpret_cast<const bf16_t*>(src), n, out, accumulate, stream);
    return cudaGetLastError();
  }
  const bool full = tuning::fullGrid(tuning::Launch::kDecode, n);
  withCodec(c, [&](auto k) {
    using K = decltype(k);
    launch<decodeKernel<K::bits, K::sym>>(elementBlocks(n, 4 * kDecodeUnroll), full, stream, src, n,
                                          c, out, accumulate);
  });
  return cudaGetLastError();
}

cudaError_t encodeRotated(const void* x, int32_t dtype, int64_t n, const CodecSpec& c, uint8_t* dst,
                          const Noise& noise, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  requireRotatable(n, c.groupSize, "rotated encode");
  const int64_t blocks = groupBlocks(n, c.groupSize);
  const bool full = otherFullGrid(n);
  withElements(dtype, [&](auto t) {
    using T = decltype(t);
    const T* xt = static_cast<const T*>(x);
    if (c.bits == 0) {  // raw: the rotated values in c.rawDtype
      withElements(c.rawDtype, [&](auto r) {
        using R = decltype(r);
        launch<rotateKernel<T, R, false>>(blocks, full, stream, xt, n, c.groupSize,
                                          reinterpret_cast<R*>(dst));
      });
      return;
    }
    withCodec(c, [&](auto k) {
      using K = decltype(k);
      launch<encodeRotatedKernel<T, K::bits, K::sym>>(blocks, full, stream, xt, n, c, dst, noise);
    });
  });
  return cudaGetLastError();
}

cudaError_t decodeRotated(const uint8_t* src, int64_t n, const CodecSpec& c, float* out,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  requireRotatable(n, c.groupSize, "rotated decode");
  const int64_t blocks = groupBlocks(n, c.groupSize);
  const bool full = otherFullGrid(n);
  if (c.bits == 0) {
    withElements(c.rawDtype, [&](auto r) {
      using R = decltype(r);
      launch<rotateKernel<R, float, true>>(blocks, full, stream, reinterpret_cast<const R*>(src), n,
                                           c.groupSize, out);
    });
    return cudaGetLastError();
  }
  withCodec(c, [&](auto k) {
    using K = decltype(k);
    launch<decodeRotatedKernel<K::bits, K::sym>>(blocks, full, stream, src, n, c, out);
  });
  return cudaGetLastError();
}

cudaError_t rotateToFloat(const void* x, int32_t dtype, int64_t n, int groupSize, float* out,
                          cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  requireRotatable(n, groupSize, "rotation");
  withElements(dtype, [&](auto t) {
    using T = decltype(t);
    launch<rotateKernel<T, float, false>>(groupBlocks(n, groupSize), otherFullGrid(n), stream,
                                          static_cast<const T*>(x), n, groupSize, out);
  });
  return cudaGetLastError();
}

cudaError_t codecPreload() {
#if defined(QCOMM_SIMT)
  return cudaSuccess;
#else
  cudaError_t e = cudaSuccess;
  auto load = [&](auto kernel) {
    cudaFuncAttributes attr;
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(kernel));
  };
  auto eachType = [](auto f) {
    f(static_cast<float*>(nullptr));
    f(static_cast<fp16_t*>(nullptr));
    f(static_cast<bf16_t*>(nullptr));
  };
  auto eachCodec = [](auto f) {
    for (int bits : {4, 8}) {
      for (int sym : {0, 1}) withCodec(CodecSpec{bits, 128, sym, kFloat32}, f);
    }
  };
  eachCodec([&](auto k) {
    using K = decltype(k);
    load(decodeKernel<K::bits, K::sym>);
    load(decodeSumKernel<K::bits, K::sym>);
    load(decodeRotatedKernel<K::bits, K::sym>);
    eachType([&](auto t) {
      using T = std::remove_pointer_t<decltype(t)>;
      load(encodeKernel<T, K::bits, K::sym, 3>);
      load(encodeKernel<T, K::bits, K::sym, 4>);
      load(encodeRotatedKernel<T, K::bits, K::sym>);
      eachCodec([&](auto o) {
        using O = decltype(o);
        load(hopKernel<T, K::bits, K::sym, O::bits, O::sym>);
      });
    });
  });
  eachType([&](auto t) {
    using T = std::remove_pointer_t<decltype(t)>;
    load(castKernel<T, float>);
    load(castKernel<T, fp16_t>);
    load(castKernel<T, bf16_t>);
    load(rawToFloatKernel<T>);
    load(rotateKernel<T, float, false>);
    load(rotateKernel<T, fp16_t, false>);
    load(rotateKernel<T, bf16_t, false>);
    load(rotateKernel<T, float, true>);
  });
  load(divideKernel);
  load(multiplyKernel);
  return e;
#endif
}

cudaError_t divide(float* x, int64_t n, float divisor, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  launch<divideKernel>(elementBlocks(n, 1), otherFullGrid(n), stream, x, n, divisor);
  return cudaGetLastError();
}

cudaError_t multiply(float* x, int64_t n, float factor, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  launch<multiplyKernel>(elementBlocks(n, 1), otherFullGrid(n), stream, x, n, factor);
  return cudaGetLastError();
}

cudaError_t decodeSum(const uint8_t* const* srcs, int count, int64_t n, const CodecSpec& c,
                      float* out, bool accumulate, cudaStream_t stream) {
  if (n == 0 || count == 0) return cudaSuccess;
  if (c.bits == 0) {  // raw elements: the decoder's casts, one block after the other
    for (int k = 0; k < count; ++k) {
      const cudaError_t e = decode(srcs[k], n, c, out, accumulate || k > 0, stream);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }
  // kMaxSumSources blocks per launch; the launches after the first add to its sum, in order (the
  // first adds to out's values with accumulate)
  for (int first = 0; first < count; first += kMaxSumSources) {
    SumSources s{};
    s.count = count - first < kMaxSumSources ? count - first : kMaxSumSources;
    for (int k = 0; k < s.count; ++k) s.block[k] = srcs[first + k];
    withCodec(c, [&](auto k) {
      using K = decltype(k);
      launch<decodeSumKernel<K::bits, K::sym>>(elementBlocks(n, 4), otherFullGrid(n), stream, s, n,
                                               c, out, accumulate || first > 0);
    });
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t decodeAddEncode(const uint8_t* src, const CodecSpec& in, const void* local,
                            int32_t localDtype, int64_t n, float* partial, const CodecSpec& out,
                            uint8_t* dst, const Noise& noise, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (in.bits == 0 || out.bits == 0 || in.groupSize != out.groupSize) {
    // raw phases: the unfused sequence (decode, add, encode) computes the same values. Where the
    // partial is the fp32 local itself (the rings' in-place sums, a rotated plan's rotation) the
    // decode adds into it: decoding over it first would lose the local values (and then add the
    // decoded ones twice); the fp32 add commutes, so the bits are those of decode + local
    // (CodecOps::decodeAdd does the same)
    const bool inPlace = localDtype == kFloat32 && static_cast<const void*>(partial) == local;
    cudaError_t e = decode(src, n, in, partial, inPlace, stream);
    if (e != cudaSuccess) return e;
    if (inPlace) {
      // the local values are in the sum already
    } else if (localDtype == kFloat32) {
      launchRawToFloat(static_cast<const float*>(local), n, partial, true, stream);
    } else if (localDtype == kFloat16) {
      launchRawToFloat(static_cast<const fp16_t*>(local), n, partial, true, stream);
    } else {
      launchRawToFloat(static_cast<const bf16_t*>(local), n, partial, true, stream);
    }
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    return encode(partial, kFloat32, n, out, dst, noise, stream);
  }
  switch (localDtype) {
    case kFloat32:
      launchHop(src, in, static_cast<const float*>(local), n, partial, out, dst, noise, stream);
      break;
    case kFloat16:
      launchHop(src, in, static_cast<const fp16_t*>(local), n, partial, out, dst, noise, stream);
      break;
    default:
      launchHop(src, in, static_cast<const bf16_t*>(local), n, partial, out, dst, noise, stream);
  }
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace qcomm
