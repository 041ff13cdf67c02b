// Test hooks (qcomm._testing): the CUDA codec kernels (csrc/cuda/) beyond what qcomm.codec offers
// (python/codec.cpp): blocks at any offset of one buffer, a hop with groups of its own, AVG's
// division, for the GPU tests. Built only with CUDA.
#ifdef QCOMM_WITH_CUDA

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <vector>

#include "common/torch_dtype.h"
#include "cuda/codec_kernels.h"

namespace py = pybind11;

namespace qcomm {

namespace {

void check(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, "[qcomm] CUDA ", what, ": ", cudaGetErrorString(e));
}

CodecSpec spec(int bits, int groupSize, bool symmetric, at::ScalarType raw) {
  const int32_t code = dtypeOf(raw);
  TORCH_CHECK_VALUE(code >= 0, "[qcomm] codec: dtype ", raw, " is not fp32, fp16 or bf16");
  TORCH_CHECK_VALUE(bits == 4 || bits == 8, "[qcomm] invalid rs_bits ", bits);
  TORCH_CHECK_VALUE(groupSize >= 32 && groupSize <= 1024 && (groupSize & (groupSize - 1)) == 0,
                    "[qcomm] invalid group_size ", groupSize);
  return CodecSpec{bits, groupSize, symmetric ? 1 : 0, code};
}

// The fp32 result of n elements: a new tensor like `like`, or the caller's `out` (any contiguous
// fp32 CUDA view of n elements, possibly misaligned: the kernels' scalar paths).
at::Tensor floatOut(py::object out, int64_t n, const at::Tensor& like, const char* fn) {
  if (out.is_none()) return at::empty({n}, like.options().dtype(at::kFloat));
  at::Tensor o = out.cast<at::Tensor>();
  TORCH_CHECK_VALUE(
      o.is_cuda() && o.scalar_type() == at::kFloat && o.is_contiguous() && o.numel() == n,
      "[qcomm] ", fn, ": `out` must be a contiguous fp32 CUDA tensor of ", n, " elements");
  return o;
}

// An encoded block's first byte: its scales are floats, read where the block starts.
const uint8_t* blockAt(const at::Tensor& bytes, int64_t offset, const char* fn) {
  const uint8_t* p = bytes.data_ptr<uint8_t>() + offset;
  TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(p) % 4 == 0, "[qcomm] ", fn,
                    ": an encoded block must start at a multiple of 4 bytes (its scales are "
                    "floats)");
  return p;
}

// The fused ring hop: partial = decode(src) + local, then partial encoded with the out codec.
// Returns (partial, encoded); with in_place (local fp32) partial is local itself, as the ring
// runs it.
py::tuple cudaHop(const at::Tensor& src, int inBits, int inGroup, bool inSym,
                  const at::Tensor& local, int outBits, int outGroup, bool outSym,
                  py::object noiseSalt, int64_t noiseBase, bool inPlace) {
  TORCH_CHECK_VALUE(src.is_cuda() && local.is_cuda(), "[qcomm] cuda_codec_hop takes CUDA tensors");
  c10::cuda::CUDAGuard guard(local.device());
  TORCH_CHECK_VALUE(local.is_contiguous(), "[qcomm] cuda_codec_hop: `local` must be contiguous");
  const int64_t n = local.numel();
  const CodecSpec in = spec(inBits, inGroup, inSym, at::kFloat);
  const CodecSpec out = spec(outBits, outGroup, outSym, at::kFloat);
  const int32_t localDtype = dtypeOf(local.scalar_type());
  TORCH_CHECK_VALUE(localDtype >= 0, "[qcomm] cuda_codec_hop: `local` is not fp32, fp16 or bf16");
  TORCH_CHECK_VALUE(src.numel() == encodedBytes(n, in), "[qcomm] codec: expected ",
                    encodedBytes(n, in), " bytes");
  TORCH_CHECK_VALUE(!inPlace || local.scalar_type() == at::kFloat,
                    "[qcomm] cuda_codec_hop: in_place needs an fp32 `local`");
  at::Tensor s = src.contiguous();
  const uint8_t* in0 = blockAt(s, 0, "cuda_codec_hop");
  at::Tensor partial = inPlace ? local : at::empty({n}, local.options().dtype(at::kFloat));
  at::Tensor dst = at::empty({encodedBytes(n, out)}, s.options());
  const Noise noise{noiseSalt.is_none() ? 0u : noiseSalt.cast<uint32_t>(), noiseBase,
                    noiseSalt.is_none() ? 0 : 1};
  check(gpu::decodeAddEncode(in0, in, local.data_ptr(), localDtype, n, partial.data_ptr<float>(),
                             out, dst.data_ptr<uint8_t>(), noise, at::cuda::getCurrentCUDAStream()),
        "decode-add-encode");
  return py::make_tuple(partial, dst);
}

// The fp32 sum, in order, of the decoded values of encoded blocks that lie in one byte tensor at
// the given byte offsets (two_step's owners' sum; any offsets, the kernel takes the scalar path
// for those it cannot load in vectors), into a new tensor or into `out` (a contiguous fp32 view
// of numel elements, possibly misaligned).
at::Tensor cudaDecodeSum(const at::Tensor& buffer, const std::vector<int64_t>& offsets, int64_t n,
                         int bits, int groupSize, bool symmetric, py::object out, bool accumulate) {
  TORCH_CHECK_VALUE(buffer.is_cuda() && buffer.scalar_type() == at::kByte && buffer.is_contiguous(),
                    "[qcomm] cuda_codec_decode_sum takes a contiguous uint8 CUDA tensor");
  c10::cuda::CUDAGuard guard(buffer.device());
  const CodecSpec s = spec(bits, groupSize, symmetric, at::kFloat);
  const int64_t bytes = encodedBytes(n, s);
  TORCH_CHECK_VALUE(!offsets.empty(), "[qcomm] cuda_codec_decode_sum: no block to sum");
  std::vector<const uint8_t*> srcs;
  for (const int64_t off : offsets) {
    TORCH_CHECK_VALUE(off >= 0 && off + bytes <= buffer.numel(),
                      "[qcomm] cuda_codec_decode_sum: ", "a block at byte ", off,
                      " does not fit the buffer of ", buffer.numel(), " bytes");
    srcs.push_back(blockAt(buffer, off, "cuda_codec_decode_sum"));
  }
  at::Tensor o = floatOut(out, n, buffer, "cuda_codec_decode_sum");
  check(gpu::decodeSum(srcs.data(), int(srcs.size()), n, s, o.data_ptr<float>(), accumulate,
                       at::cuda::getCurrentCUDAStream()),
        "decode-sum");
  return o;
}

// x /= world in place (AVG's division, gpu::divide); returns x.
at::Tensor cudaDivide(const at::Tensor& x, int world) {
  TORCH_CHECK_VALUE(x.is_cuda() && x.scalar_type() == at::kFloat && x.is_contiguous(),
                    "[qcomm] cuda_codec_divide takes a contiguous fp32 CUDA tensor");
  TORCH_CHECK_VALUE(world >= 1, "[qcomm] cuda_codec_divide: world must be >= 1, got ", world);
  c10::cuda::CUDAGuard guard(x.device());
  check(gpu::divide(x.data_ptr<float>(), x.numel(), float(world), at::cuda::getCurrentCUDAStream()),
        "divide");
  return x;
}

}  // namespace

void registerCudaTesting(py::module& m) {
  m.def("cuda_codec_decode_sum", &cudaDecodeSum, py::arg("buffer"), py::arg("offsets"),
        py::arg("numel"), py::arg("bits"), py::arg("group_size"), py::arg("symmetric"),
        py::arg("out") = py::none(), py::arg("accumulate") = false);
  m.def("cuda_codec_divide", &cudaDivide, py::arg("x"), py::arg("world"));
  m.def("cuda_codec_hop", &cudaHop, py::arg("src"), py::arg("in_bits"), py::arg("in_group"),
        py::arg("in_symmetric"), py::arg("local"), py::arg("out_bits"), py::arg("out_group"),
        py::arg("out_symmetric"), py::arg("noise_salt") = py::none(), py::arg("noise_base") = 0,
        py::arg("in_place") = false);
}

}  // namespace qcomm

#endif  // QCOMM_WITH_CUDA
