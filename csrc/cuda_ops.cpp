// Python entry points to the CUDA codec kernels (csrc/cuda/), for the GPU tests and benchmarks.
// The only file that joins torch's CUDA headers to the kernels' launch API; built only with CUDA.
#ifdef QCOMM_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <pybind11/pybind11.h>
#include <torch/extension.h>

#include "cuda/codec_kernels.h"

namespace py = pybind11;

namespace qcomm {

int32_t codecDtype(at::ScalarType t);  // backend.cpp

namespace {

void check(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, "[qcomm] CUDA ", what, ": ", cudaGetErrorString(e));
}

CodecSpec spec(int bits, int groupSize, bool symmetric, at::ScalarType raw) {
  const int32_t code = codecDtype(raw);
  TORCH_CHECK_VALUE(code >= 0, "[qcomm] codec: dtype ", raw, " is not fp32, fp16 or bf16");
  TORCH_CHECK_VALUE(bits == 4 || bits == 8, "[qcomm] invalid rs_bits ", bits);
  TORCH_CHECK_VALUE(groupSize >= 32 && groupSize <= 1024 && (groupSize & (groupSize - 1)) == 0,
                    "[qcomm] invalid group_size ", groupSize);
  return CodecSpec{bits, groupSize, symmetric ? 1 : 0, code};
}

at::Tensor cudaEncode(const at::Tensor& x, int bits, int groupSize, bool symmetric,
                      py::object noiseSalt, int64_t noiseBase) {
  TORCH_CHECK_VALUE(x.is_cuda(), "[qcomm] cuda_codec_encode takes a CUDA tensor");
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor c = x.contiguous().view({-1});
  const CodecSpec s = spec(bits, groupSize, symmetric, c.scalar_type());
  // every byte is written by the kernel (metadata, padding, codes), so no memset is needed
  at::Tensor out = at::empty({encodedBytes(c.numel(), s)}, c.options().dtype(at::kByte));
  const Noise noise{noiseSalt.is_none() ? 0u : noiseSalt.cast<uint32_t>(), noiseBase,
                    noiseSalt.is_none() ? 0 : 1};
  check(gpu::encode(c.data_ptr(), s.rawDtype, c.numel(), s, out.data_ptr<uint8_t>(), noise,
                    at::cuda::getCurrentCUDAStream()),
        "encode");
  return out;
}

at::Tensor cudaDecode(const at::Tensor& bytes, int64_t n, int bits, int groupSize, bool symmetric) {
  TORCH_CHECK_VALUE(bytes.is_cuda(), "[qcomm] cuda_codec_decode takes a CUDA tensor");
  c10::cuda::CUDAGuard guard(bytes.device());
  const CodecSpec s = spec(bits, groupSize, symmetric, at::kFloat);
  TORCH_CHECK_VALUE(bytes.numel() == encodedBytes(n, s), "[qcomm] codec: expected ",
                    encodedBytes(n, s), " bytes");
  at::Tensor b = bytes.contiguous();
  at::Tensor out = at::empty({n}, b.options().dtype(at::kFloat));
  check(gpu::decode(b.data_ptr<uint8_t>(), n, s, out.data_ptr<float>(), false,
                    at::cuda::getCurrentCUDAStream()),
        "decode");
  return out;
}

}  // namespace

void registerCudaOps(py::module& m) {
  m.def("cuda_codec_encode", &cudaEncode, py::arg("x"), py::arg("bits"), py::arg("group_size"),
        py::arg("symmetric"), py::arg("noise_salt") = py::none(), py::arg("noise_base") = 0);
  m.def("cuda_codec_decode", &cudaDecode, py::arg("bytes"), py::arg("numel"), py::arg("bits"),
        py::arg("group_size"), py::arg("symmetric"));
}

}  // namespace qcomm

#endif  // QCOMM_WITH_CUDA
