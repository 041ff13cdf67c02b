// CodecOps: the codec operations the collective algorithms (collective_algos.h) need, on raw
// pointers to memory of one device, so that one orchestration serves CPU and CUDA tensors.
// CpuCodecOps runs the CPU loops (codec_cpu.h); CudaCodecOps (cuda_codec_ops.cpp) enqueues the
// CUDA kernels (cuda/codec_kernels.h) on one stream. Both compute the same bits (DESIGN
// invariant 3): the per-element math is codec.h's, sums are fp32 and each is written in one order.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>

#include "codec/codec.h"

namespace qcomm {

struct CodecOps {
  virtual ~CodecOps() = default;

  // dst = the encoded block of x[0..n) (elements of `dtype`), encodedBytes(n, spec) bytes; with
  // spec.bits == 0 the elements are stored raw in spec.rawDtype.
  virtual void encode(const void* x, int32_t dtype, int64_t n, const CodecSpec& spec, uint8_t* dst,
                      const Noise& noise) = 0;
  // out = x^ of the block at src (out += x^ with accumulate).
  virtual void decode(const uint8_t* src, int64_t n, const CodecSpec& spec, float* out,
                      bool accumulate) = 0;
  // out = decode(srcs[0]) + decode(srcs[1]) + ... (count blocks of n elements, one codec),
  // summed in fp32 in that order: the values of a decode and count - 1 decodes with accumulate.
  virtual void decodeSum(const uint8_t* const* srcs, int count, int64_t n, const CodecSpec& spec,
                         float* out) {
    for (int k = 0; k < count; ++k) decode(srcs[k], n, spec, out, k > 0);
  }
  // One ring hop: partial = decode(src with `in`) + float(local), then dst = encode(partial with
  // `out`). partial (fp32, n) keeps the sum.
  virtual void decodeAddEncode(const uint8_t* src, const CodecSpec& in, const void* local,
                               int32_t localDtype, int64_t n, float* partial, const CodecSpec& out,
                               uint8_t* dst, const Noise& noise) = 0;
  // acc[i] = acc[i] + float(x[i]) for x of `dtype`.
  virtual void addToFloat(const void* x, int32_t dtype, int64_t n, float* acc) = 0;
  // out[i] = float(x[i]).
  virtual void castToFloat(const void* x, int32_t dtype, int64_t n, float* out) = 0;
  // out[i] = dtype(x[i]), rounding to nearest even.
  virtual void castFromFloat(const float* x, int64_t n, int32_t dtype, void* out) = 0;
  // x[i] = x[i] / world, in fp32 (AVG).
  virtual void divide(float* x, int64_t n, int world) = 0;
};

struct CpuCodecOps final : CodecOps {
  void encode(const void* x, int32_t dtype, int64_t n, const CodecSpec& spec, uint8_t* dst,
              const Noise& noise) override;
  void decode(const uint8_t* src, int64_t n, const CodecSpec& spec, float* out,
              bool accumulate) override;
  void decodeAddEncode(const uint8_t* src, const CodecSpec& in, const void* local,
                       int32_t localDtype, int64_t n, float* partial, const CodecSpec& out,
                       uint8_t* dst, const Noise& noise) override;
  void addToFloat(const void* x, int32_t dtype, int64_t n, float* acc) override;
  void castToFloat(const void* x, int32_t dtype, int64_t n, float* out) override;
  void castFromFloat(const float* x, int64_t n, int32_t dtype, void* out) override;
  void divide(float* x, int64_t n, int world) override;
};

// The CodecOps of memory on `device`: the CPU loops, or (CUDA builds) the CUDA kernels enqueued on
// the device's current stream. A CUDA device in a CPU-only build is a clear error.
std::unique_ptr<CodecOps> codecOpsFor(const c10::Device& device);

#ifdef QCOMM_WITH_CUDA
// The CUDA kernels enqueued on `stream` (a cudaStream_t) of CUDA device `deviceIndex`
// (cuda_codec_ops.cpp).
std::unique_ptr<CodecOps> makeCudaCodecOps(void* stream, c10::DeviceIndex deviceIndex);
#endif

}  // namespace qcomm
