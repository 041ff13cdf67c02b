// Launch API of the CUDA codec kernels: raw device pointers and a stream, no torch headers, so
// nvcc stays fast and the kernels can be tested on their own. The math is csrc/codec/codec.h's, the
// same functions the CPU loops call: for the same input the wire bytes and decoded values equal
// the CPU path's bit for bit (reductions here run in another order, which min, max and the
// non-finite flag do not notice; codec.h normalises the one order-dependent bit, the sign of 0).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "codec/codec.h"

namespace qcomm {
namespace gpu {

// Every launch takes cuda/tuning.h's choices of grid and encoder blocks per SM, which read
// QCOMM_CUDA_FULL_GRID and QCOMM_CUDA_ENCODE_BLOCKS (common/settings.h, once per process): with
// an invalid value of one, a launch that reads it throws std::invalid_argument instead.

// Encode x[0..n) (elements of `dtype`) into dst (encodedBytes(n, c) bytes); c.bits == 0 stores
// the elements raw in c.rawDtype.
cudaError_t encode(const void* x, int32_t dtype, int64_t n, const CodecSpec& c, uint8_t* dst,
                   const Noise& noise, cudaStream_t stream);

// Decode an encoded block of n elements into fp32 out (out = x^, or out += x^).
cudaError_t decode(const uint8_t* src, int64_t n, const CodecSpec& c, float* out, bool accumulate,
                   cudaStream_t stream);

// out = the fp32 sum, in order, of the decoded values of `count` encoded blocks of n elements
// (srcs[0], srcs[1], ...; one codec), added to out with accumulate: the values of decode(srcs[0])
// (with accumulate: decode with accumulate) then decode with accumulate of each next block, bit
// for bit, without writing and reading back the partial sums.
constexpr int kMaxSumSources = 8;  // blocks per launch (more take several launches)
struct SumSources {
  const uint8_t* block[kMaxSumSources];
  int count;
};
cudaError_t decodeSum(const uint8_t* const* srcs, int count, int64_t n, const CodecSpec& c,
                      float* out, bool accumulate, cudaStream_t stream);

// x[0..n) /= divisor in fp32, each an IEEE division as the CPU's divideBy (AVG).
cudaError_t divide(float* x, int64_t n, float divisor, cudaStream_t stream);
// x[0..n) *= factor in fp32, each one IEEE product as the CPU's multiplyBy (a reduce-scatter's
// PREMUL_SUM, on the fp32 sum).
cudaError_t multiply(float* x, int64_t n, float factor, cudaStream_t stream);

// One ring hop, fused: partial = decode(src with `in`) + local (local of `localDtype`), then
// encode partial with `out` into dst. partial (fp32, n) keeps the sum for the caller; it may be
// `local` itself (an fp32 local, summed in place: the bits of decode + local), in every phase.
cudaError_t decodeAddEncode(const uint8_t* src, const CodecSpec& in, const void* local,
                            int32_t localDtype, int64_t n, float* partial, const CodecSpec& out,
                            uint8_t* dst, const Noise& noise, cudaStream_t stream);

// The rotated codec (QuantConfig.rotate; codec.h hadamardGroup), one warp per group with the
// group in its registers: n a multiple of the group size, which is a power of two from 32 to 1024
// (else std::invalid_argument). The same bits as the CPU's encodeRotatedBlock,
// decodeRotatedBlock and rotateToFloat (codec_cpu.h). encodeRotated: the encoded block of H x
// per group (c.bits == 0: H x stored in c.rawDtype); decodeRotated: out = H x^ / g per group;
// rotateToFloat: out = H float(x) per group of groupSize (out may be x, for fp32 x).
cudaError_t encodeRotated(const void* x, int32_t dtype, int64_t n, const CodecSpec& c, uint8_t* dst,
                          const Noise& noise, cudaStream_t stream);
cudaError_t decodeRotated(const uint8_t* src, int64_t n, const CodecSpec& c, float* out,
                          cudaStream_t stream);
cudaError_t rotateToFloat(const void* x, int32_t dtype, int64_t n, int groupSize, float* out,
                          cudaStream_t stream);

// The grid of a grid-stride codec kernel whose work is `needed` blocks when at most `cap` are
// resident: ceil(needed / turns) with turns = ceil(needed / cap), the fewest blocks that finish
// in as many turns as the whole chip would, so every block takes `turns` or `turns - 1` (at least
// 1 block; at most cap). Exposed for the emulator's check.
int balancedGrid(int64_t needed, int64_t cap);

// Loads every codec kernel on the current device: under lazy loading (CUDA 12.2+'s default) a
// kernel loads at its first launch, and loading waits for the context's running kernels. Ranks
// that are threads of one process share a context, so a rank loading a codec kernel while a
// peer's barrier kernel (the separate kernels over CUDA IPC) waits for this rank would wait for
// that kernel, and it for this rank. Called at the IPC transport's set-up (see ipcPreload).
cudaError_t codecPreload();

}  // namespace gpu
}  // namespace qcomm
