// CudaCodecOps (cuda_codec_ops.h). Built only with CUDA.
#ifdef QCOMM_WITH_CUDA

#include "cuda/cuda_codec_ops.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/codec_kernels.h"

namespace qcomm {
namespace {

// A raw phase of `dtype`: encode with it casts to dtype, decode with it casts to fp32.
CodecSpec rawSpec(int32_t dtype) { return CodecSpec{0, 32, 0, dtype}; }

class CudaCodecOps final : public CodecOps {
 public:
  explicit CudaCodecOps(cudaStream_t stream) : stream_(stream) {}

  void encode(const void* x, int32_t dtype, int64_t n, const CodecSpec& spec, uint8_t* dst,
              const Noise& noise) override {
    check(gpu::encode(x, dtype, n, spec, dst, noise, stream_), "encode");
  }
  void decode(const uint8_t* src, int64_t n, const CodecSpec& spec, float* out,
              bool accumulate) override {
    check(gpu::decode(src, n, spec, out, accumulate, stream_), "decode");
  }
  void decodeAddEncode(const uint8_t* src, const CodecSpec& in, const void* local,
                       int32_t localDtype, int64_t n, float* partial, const CodecSpec& out,
                       uint8_t* dst, const Noise& noise) override {
    check(gpu::decodeAddEncode(src, in, local, localDtype, n, partial, out, dst, noise, stream_),
          "decode-add-encode");
  }
  // one kernel keeps the sum in registers (8 blocks per launch), where the base class's decodes
  // would write and read it back once per block; it takes every block once all have arrived
  void decodeSum(const std::function<const uint8_t*(int)>& src, int count, int64_t n,
                 const CodecSpec& spec, float* out, bool accumulate) override {
    std::vector<const uint8_t*> srcs;
    for (int k = 0; k < count; ++k) srcs.push_back(src(k));
    check(gpu::decodeSum(srcs.data(), count, n, spec, out, accumulate, stream_), "decode-sum");
  }
  void encodeRotated(const void* x, int32_t dtype, int64_t n, const CodecSpec& spec, uint8_t* dst,
                     const Noise& noise) override {
    check(gpu::encodeRotated(x, dtype, n, spec, dst, noise, stream_), "rotated encode");
  }
  void decodeRotated(const uint8_t* src, int64_t n, const CodecSpec& spec, float* out) override {
    check(gpu::decodeRotated(src, n, spec, out, stream_), "rotated decode");
  }
  void rotateToFloat(const void* x, int32_t dtype, int64_t n, int groupSize, float* out) override {
    check(gpu::rotateToFloat(x, dtype, n, groupSize, out, stream_), "rotation");
  }
  void addToFloat(const void* x, int32_t dtype, int64_t n, float* acc) override {
    decode(static_cast<const uint8_t*>(x), n, rawSpec(dtype), acc, true);
  }
  void castToFloat(const void* x, int32_t dtype, int64_t n, float* out) override {
    decode(static_cast<const uint8_t*>(x), n, rawSpec(dtype), out, false);
  }
  void castFromFloat(const float* x, int64_t n, int32_t dtype, void* out) override {
    encode(x, kFloat32, n, rawSpec(dtype), static_cast<uint8_t*>(out), Noise{0, 0, 0});
  }
  void divide(float* x, int64_t n, int world) override {
    // qcomm's own kernel, not torch's div_: codecPreload loads it at the IPC set-up, and a torch
    // kernel's first launch, loaded lazily, would wait for a peer rank's spinning barrier kernel
    // where ranks are threads of one process (see gpu::codecPreload)
    check(gpu::divide(x, n, float(world), stream_), "divide");
  }
  void multiply(float* x, int64_t n, float factor) override {
    check(gpu::multiply(x, n, factor, stream_), "multiply");  // preloaded too, as divide
  }

 private:
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
      throw std::runtime_error(std::string("CUDA ") + what + " kernel: " + cudaGetErrorString(e));
    }
  }

  cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<CodecOps> makeCudaCodecOps(cudaStream_t stream) {
  return std::make_unique<CudaCodecOps>(stream);
}

}  // namespace qcomm

#endif  // QCOMM_WITH_CUDA
