// CudaCodecOps: CodecOps over the CUDA codec kernels (cuda/codec_kernels.h), every operation
// enqueued on one stream, none blocking the host. Built only with CUDA.
#ifdef QCOMM_WITH_CUDA

#include <c10/cuda/CUDAStream.h>

#include "codec/codec_ops.h"
#include "cuda/codec_kernels.h"

namespace qcomm {
namespace {

// A raw phase of `dtype`: encode with it casts to dtype, decode with it casts to fp32.
CodecSpec rawSpec(int32_t dtype) { return CodecSpec{0, 32, 0, dtype}; }

class CudaCodecOps final : public CodecOps {
 public:
  CudaCodecOps(cudaStream_t stream, c10::DeviceIndex device)
      : stream_(c10::cuda::getStreamFromExternal(stream, device)) {}

  void encode(const void* x, int32_t dtype, int64_t n, const CodecSpec& spec, uint8_t* dst,
              const Noise& noise) override {
    check(gpu::encode(x, dtype, n, spec, dst, noise, stream_.stream()), "encode");
  }
  void decode(const uint8_t* src, int64_t n, const CodecSpec& spec, float* out,
              bool accumulate) override {
    check(gpu::decode(src, n, spec, out, accumulate, stream_.stream()), "decode");
  }
  void decodeAddEncode(const uint8_t* src, const CodecSpec& in, const void* local,
                       int32_t localDtype, int64_t n, float* partial, const CodecSpec& out,
                       uint8_t* dst, const Noise& noise) override {
    check(gpu::decodeAddEncode(src, in, local, localDtype, n, partial, out, dst, noise,
                               stream_.stream()),
          "decode-add-encode");
  }
  // one kernel keeps the sum in registers (8 blocks per launch), where the base class's decodes
  // would write and read it back once per block
  void decodeSum(const uint8_t* const* srcs, int count, int64_t n, const CodecSpec& spec,
                 float* out) override {
    check(gpu::decodeSum(srcs, count, n, spec, out, stream_.stream()), "decode-sum");
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
    check(gpu::divide(x, n, float(world), stream_.stream()), "divide");
  }

 private:
  static void check(cudaError_t e, const char* what) {
    TORCH_CHECK(e == cudaSuccess, "CUDA ", what, " kernel: ", cudaGetErrorString(e));
  }

  c10::cuda::CUDAStream stream_;
};

}  // namespace

std::unique_ptr<CodecOps> makeCudaCodecOps(void* stream, c10::DeviceIndex deviceIndex) {
  return std::make_unique<CudaCodecOps>(static_cast<cudaStream_t>(stream), deviceIndex);
}

}  // namespace qcomm

#endif  // QCOMM_WITH_CUDA
