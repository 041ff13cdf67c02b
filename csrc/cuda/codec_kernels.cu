// CUDA codec kernels over csrc/codec.h. One warp per quantization group for encoding (the group's
// min/max/absmax are warp reductions, then each lane quantizes its elements); one thread per
// element for decoding. Grids are capped and grid-stride, so any numel works.
#include "codec_kernels.h"
#include "warp_codec.cuh"

namespace qcomm {
namespace gpu {
namespace {

constexpr int kBlock = 256;  // 8 warps per block: 8 groups in flight per block
constexpr int64_t kMaxBlocks = 65535;

template <class T, int kBits, bool kSym>
__global__ void encodeKernel(const T* x, int64_t n, CodecSpec c, uint8_t* block, Noise noise) {
  const int64_t groups = numGroups(n, c);
  const int64_t warpsTotal = int64_t(gridDim.x) * (blockDim.x / kWarp);
  uint8_t* data = block + dataOffset(n, c);
  if (blockIdx.x == 0) {  // zero the padding between metadata and data
    for (int64_t i = metaBytes(n, c) + threadIdx.x; i < dataOffset(n, c); i += blockDim.x) {
      block[i] = 0;
    }
  }
  for (int64_t g = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp; g < groups;
       g += warpsTotal) {
    const int64_t begin = g * c.groupSize;
    const int len = groupLength(n, c, g);
    auto value = [&](int k) { return toFloat(x[begin + k]); };
    const GroupParams p = warpGroupParams<kSym>(len, kBits, value);
    if (threadIdx.x % kWarp == 0) storeParams(block, n, c, g, p);
    warpQuantize<kBits, kSym>(p, begin, len, data, noise, value);
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

template <int kBits, bool kSym>
__global__ void decodeKernel(const uint8_t* block, int64_t n, CodecSpec c, float* out,
                             bool accumulate) {
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const float v = decodeAt<kBits, kSym>(block, n, c, e);
    out[e] = accumulate ? out[e] + v : v;
  }
}

// partial = decode(src) + local, then encode partial: one warp per group of the output codec
// (both codecs share the group size).
template <class T, int kInBits, bool kInSym, int kOutBits, bool kOutSym>
__global__ void hopKernel(const uint8_t* src, CodecSpec in, const T* local, int64_t n,
                          float* partial, CodecSpec out, uint8_t* dst, Noise noise) {
  const int64_t groups = numGroups(n, out);
  const int64_t warpsTotal = int64_t(gridDim.x) * (blockDim.x / kWarp);
  if (blockIdx.x == 0) {
    for (int64_t i = metaBytes(n, out) + threadIdx.x; i < dataOffset(n, out); i += blockDim.x) {
      dst[i] = 0;
    }
  }
  for (int64_t g = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp; g < groups;
       g += warpsTotal) {
    const int64_t begin = g * out.groupSize;
    const int len = groupLength(n, out, g);
    const int lane = threadIdx.x % kWarp;
    for (int k = lane; k < len; k += kWarp) {
      const float d = kInBits == 0 ? 0.0f : decodeAt<kInBits, kInSym>(src, n, in, begin + k);
      partial[begin + k] = d + toFloat(local[begin + k]);
    }
    __syncwarp();
    auto value = [&](int k) { return partial[begin + k]; };
    const GroupParams p = warpGroupParams<kOutSym>(len, kOutBits, value);
    if (lane == 0) storeParams(dst, n, out, g, p);
    warpQuantize<kOutBits, kOutSym>(p, begin, len, dst + dataOffset(n, out), noise, value);
  }
}

int gridFor(int64_t items, int perBlock) {
  const int64_t blocks = (items + perBlock - 1) / perBlock;
  return int(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

template <class T>
void launchEncode(const T* x, int64_t n, const CodecSpec& c, uint8_t* dst, const Noise& noise,
                  cudaStream_t s) {
  const int grid = gridFor(numGroups(n, c), kBlock / kWarp);
  if (c.bits == 8) {
    if (c.symmetric)
      encodeKernel<T, 8, true><<<grid, kBlock, 0, s>>>(x, n, c, dst, noise);
    else
      encodeKernel<T, 8, false><<<grid, kBlock, 0, s>>>(x, n, c, dst, noise);
  } else {
    if (c.symmetric)
      encodeKernel<T, 4, true><<<grid, kBlock, 0, s>>>(x, n, c, dst, noise);
    else
      encodeKernel<T, 4, false><<<grid, kBlock, 0, s>>>(x, n, c, dst, noise);
  }
}

template <class T>
void launchCast(const T* x, int64_t n, int32_t to, void* out, cudaStream_t s) {
  const int grid = gridFor(n, kBlock);
  if (to == kFloat32)
    castKernel<<<grid, kBlock, 0, s>>>(x, n, static_cast<float*>(out));
  else if (to == kFloat16)
    castKernel<<<grid, kBlock, 0, s>>>(x, n, static_cast<fp16_t*>(out));
  else
    castKernel<<<grid, kBlock, 0, s>>>(x, n, static_cast<bf16_t*>(out));
}

template <class T, int kInBits, bool kInSym>
void launchHopOut(const uint8_t* src, const CodecSpec& in, const T* local, int64_t n,
                  float* partial, const CodecSpec& out, uint8_t* dst, const Noise& noise,
                  cudaStream_t s) {
  const int grid = gridFor(numGroups(n, out), kBlock / kWarp);
  if (out.bits == 8) {
    if (out.symmetric)
      hopKernel<T, kInBits, kInSym, 8, true>
          <<<grid, kBlock, 0, s>>>(src, in, local, n, partial, out, dst, noise);
    else
      hopKernel<T, kInBits, kInSym, 8, false>
          <<<grid, kBlock, 0, s>>>(src, in, local, n, partial, out, dst, noise);
  } else {
    if (out.symmetric)
      hopKernel<T, kInBits, kInSym, 4, true>
          <<<grid, kBlock, 0, s>>>(src, in, local, n, partial, out, dst, noise);
    else
      hopKernel<T, kInBits, kInSym, 4, false>
          <<<grid, kBlock, 0, s>>>(src, in, local, n, partial, out, dst, noise);
  }
}

template <class T>
void launchHop(const uint8_t* src, const CodecSpec& in, const T* local, int64_t n, float* partial,
               const CodecSpec& out, uint8_t* dst, const Noise& noise, cudaStream_t s) {
  if (in.bits == 8) {
    if (in.symmetric)
      launchHopOut<T, 8, true>(src, in, local, n, partial, out, dst, noise, s);
    else
      launchHopOut<T, 8, false>(src, in, local, n, partial, out, dst, noise, s);
  } else {
    if (in.symmetric)
      launchHopOut<T, 4, true>(src, in, local, n, partial, out, dst, noise, s);
    else
      launchHopOut<T, 4, false>(src, in, local, n, partial, out, dst, noise, s);
  }
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
  const int grid = gridFor(n, kBlock);
  if (c.bits == 0) {
    if (c.rawDtype == kFloat32)
      rawToFloatKernel<<<grid, kBlock, 0, stream>>>(reinterpret_cast<const float*>(src), n, out,
                                                    accumulate);
    else if (c.rawDtype == kFloat16)
      rawToFloatKernel<<<grid, kBlock, 0, stream>>>(reinterpret_cast<const fp16_t*>(src), n, out,
                                                    accumulate);
    else
      rawToFloatKernel<<<grid, kBlock, 0, stream>>>(reinterpret_cast<const bf16_t*>(src), n, out,
                                                    accumulate);
    return cudaGetLastError();
  }
  if (c.bits == 8) {
    if (c.symmetric)
      decodeKernel<8, true><<<grid, kBlock, 0, stream>>>(src, n, c, out, accumulate);
    else
      decodeKernel<8, false><<<grid, kBlock, 0, stream>>>(src, n, c, out, accumulate);
  } else {
    if (c.symmetric)
      decodeKernel<4, true><<<grid, kBlock, 0, stream>>>(src, n, c, out, accumulate);
    else
      decodeKernel<4, false><<<grid, kBlock, 0, stream>>>(src, n, c, out, accumulate);
  }
  return cudaGetLastError();
}

cudaError_t decodeAddEncode(const uint8_t* src, const CodecSpec& in, const void* local,
                            int32_t localDtype, int64_t n, float* partial, const CodecSpec& out,
                            uint8_t* dst, const Noise& noise, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (in.bits == 0 || out.bits == 0 || in.groupSize != out.groupSize) {
    // raw phases: the unfused sequence (decode, add, encode) computes the same values
    cudaError_t e = decode(src, n, in, partial, false, stream);
    if (e != cudaSuccess) return e;
    const int grid = gridFor(n, kBlock);
    if (localDtype == kFloat32)
      rawToFloatKernel<<<grid, kBlock, 0, stream>>>(static_cast<const float*>(local), n, partial,
                                                    true);
    else if (localDtype == kFloat16)
      rawToFloatKernel<<<grid, kBlock, 0, stream>>>(static_cast<const fp16_t*>(local), n, partial,
                                                    true);
    else
      rawToFloatKernel<<<grid, kBlock, 0, stream>>>(static_cast<const bf16_t*>(local), n, partial,
                                                    true);
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
