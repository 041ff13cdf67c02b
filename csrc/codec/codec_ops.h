// CodecOps: the codec operations the algorithms (csrc/algo/) need, on raw pointers to memory of
// one device, so that one schedule serves CPU and CUDA tensors. CpuCodecOps runs the CPU loops
// (codec_cpu.h); CudaCodecOps (csrc/cuda/cuda_codec_ops.h) enqueues the CUDA kernels on one
// stream. Both compute the same bits (DESIGN invariant 3): the per-element math is codec.h's, sums
// are fp32 and each is written in one order.
#pragma once

#include <cstdint>
#include <functional>

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
  // out = x^ of the block at src, where out is the call's result, written for the last time
  // (nothing of the call reads it again): the CPU writes a large one past the cache.
  virtual void decodeResult(const uint8_t* src, int64_t n, const CodecSpec& spec, float* out) {
    decode(src, n, spec, out, false);
  }
  // out = decode(src(0)) + decode(src(1)) + ... + decode(src(count - 1)), summed in fp32 in that
  // order (out = out + decode(src(0)) + ... with accumulate): the values of a decode and count - 1
  // decodes with accumulate (count of them with accumulate). src(j) may wait for block j to
  // arrive: the CPU waits for every block, then decodes them in one pass over out; the CUDA
  // kernels take them all in one launch.
  virtual void decodeSum(const std::function<const uint8_t*(int)>& src, int count, int64_t n,
                         const CodecSpec& spec, float* out, bool accumulate) {
    for (int k = 0; k < count; ++k) decode(src(k), n, spec, out, accumulate || k > 0);
  }
  // One ring hop: partial = decode(src with `in`) + float(local), then dst = encode(partial with
  // `out`). partial (fp32, n) keeps the sum; it may be `local` itself (an fp32 local, summed in
  // place: local + decoded, the same bits).
  virtual void decodeAddEncode(const uint8_t* src, const CodecSpec& in, const void* local,
                               int32_t localDtype, int64_t n, float* partial, const CodecSpec& out,
                               uint8_t* dst, const Noise& noise) = 0;
  // partial = decode(src) + float(local), the hop without its encode; partial may be `local`.
  void decodeAdd(const uint8_t* src, const CodecSpec& in, const void* local, int32_t localDtype,
                 int64_t n, float* partial) {
    if (localDtype == kFloat32 && static_cast<const void*>(partial) == local) {
      decode(src, n, in, partial, true);
      return;
    }
    decode(src, n, in, partial, false);
    addToFloat(local, localDtype, n, partial);
  }
  // acc[i] = acc[i] + float(x[i]) for x of `dtype`.
  virtual void addToFloat(const void* x, int32_t dtype, int64_t n, float* acc) = 0;
  // out[i] = float(x[i]).
  virtual void castToFloat(const void* x, int32_t dtype, int64_t n, float* out) = 0;
  // out[i] = dtype(x[i]), rounding to nearest even.
  virtual void castFromFloat(const float* x, int64_t n, int32_t dtype, void* out) = 0;
  // x[i] = x[i] / world, in fp32 (AVG).
  virtual void divide(float* x, int64_t n, int world) = 0;
  // x[i] = x[i] * factor, in fp32 (a reduce-scatter's PREMUL_SUM). A device without it throws
  // std::runtime_error.
  virtual void multiply(float* x, int64_t n, float factor);

  // The rotated forms (QuantConfig.rotate), on whole groups: n a multiple of spec.groupSize.
  // Each group is rotated (codec.h hadamardGroup) on its way into the quantizer or out of the
  // decoder, never in a pass of its own. A device without them throws std::runtime_error.
  // dst = the encoded block of H x (per group).
  virtual void encodeRotated(const void* x, int32_t dtype, int64_t n, const CodecSpec& spec,
                             uint8_t* dst, const Noise& noise);
  // out = H x^ / g (per group): the block decoded and rotated back.
  virtual void decodeRotated(const uint8_t* src, int64_t n, const CodecSpec& spec, float* out);
  // out = H float(x) (per group of groupSize); out may be x (fp32 x).
  virtual void rotateToFloat(const void* x, int32_t dtype, int64_t n, int groupSize, float* out);
};

struct CpuCodecOps final : CodecOps {
  void encode(const void* x, int32_t dtype, int64_t n, const CodecSpec& spec, uint8_t* dst,
              const Noise& noise) override;
  void decode(const uint8_t* src, int64_t n, const CodecSpec& spec, float* out,
              bool accumulate) override;
  // decodeBlockStreamed from kStreamedDecodeBytes of output up
  void decodeResult(const uint8_t* src, int64_t n, const CodecSpec& spec, float* out) override;
  // waits for every block, then decodes and sums them in one pass (codec_cpu.h decodeSumBlock)
  void decodeSum(const std::function<const uint8_t*(int)>& src, int count, int64_t n,
                 const CodecSpec& spec, float* out, bool accumulate) override;
  void decodeAddEncode(const uint8_t* src, const CodecSpec& in, const void* local,
                       int32_t localDtype, int64_t n, float* partial, const CodecSpec& out,
                       uint8_t* dst, const Noise& noise) override;
  void addToFloat(const void* x, int32_t dtype, int64_t n, float* acc) override;
  void castToFloat(const void* x, int32_t dtype, int64_t n, float* out) override;
  void castFromFloat(const float* x, int64_t n, int32_t dtype, void* out) override;
  void divide(float* x, int64_t n, int world) override;
  void multiply(float* x, int64_t n, float factor) override;
  void encodeRotated(const void* x, int32_t dtype, int64_t n, const CodecSpec& spec, uint8_t* dst,
                     const Noise& noise) override;
  void decodeRotated(const uint8_t* src, int64_t n, const CodecSpec& spec, float* out) override;
  void rotateToFloat(const void* x, int32_t dtype, int64_t n, int groupSize, float* out) override;
};

}  // namespace qcomm
