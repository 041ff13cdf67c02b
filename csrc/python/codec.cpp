// The codec as qcomm.codec offers it (python/codec.h): a tensor encoded and decoded exactly as the
// wire does, on the CPU loops for CPU tensors and on the CUDA kernels (the current stream) for
// CUDA tensors; and the two fused steps of the schedules, two_step's sum of the ranks' copies and
// the ring's hop, which the benchmarks time.
#include "python/codec.h"

#include <pybind11/stl.h>

#include <tuple>
#include <vector>

#include "codec/codec_cpu.h"
#ifdef QCOMM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "cuda/codec_kernels.h"
#endif

namespace py = pybind11;

namespace qcomm {
namespace {

#ifdef QCOMM_WITH_CUDA
void check(cudaError_t e, const char* what) {
  TORCH_CHECK(e == cudaSuccess, "[qcomm] CUDA ", what, ": ", cudaGetErrorString(e));
}

// The kernels quantize only: bits 4 or 8.
CodecSpec cudaSpec(int bits, int groupSize, bool symmetric, at::ScalarType raw) {
  TORCH_CHECK_VALUE(bits == 4 || bits == 8, "[qcomm] codec: CUDA tensors take bits 4 or 8, not ",
                    bits);
  return codecSpec(bits, groupSize, symmetric, raw);
}

at::Tensor cudaEncode(const at::Tensor& x, int bits, int groupSize, bool symmetric,
                      const py::object& noiseSalt, int64_t noiseBase) {
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor c = x.contiguous().view({-1});
  const CodecSpec s = cudaSpec(bits, groupSize, symmetric, c.scalar_type());
  // every byte is written by the kernel (metadata, padding, codes), so no memset is needed
  at::Tensor out = at::empty({encodedBytes(c.numel(), s)}, c.options().dtype(at::kByte));
  check(gpu::encode(c.data_ptr(), s.rawDtype, c.numel(), s, out.data_ptr<uint8_t>(),
                    noiseOf(noiseSalt, noiseBase), at::cuda::getCurrentCUDAStream()),
        "encode");
  return out;
}

// Into a new fp32 tensor, or into `out` (any contiguous fp32 CUDA view of n elements, possibly
// misaligned: the kernel's scalar path), adding to it with accumulate.
at::Tensor cudaDecode(const at::Tensor& bytes, int64_t n, int bits, int groupSize, bool symmetric,
                      at::ScalarType raw, const c10::optional<at::Tensor>& into, bool accumulate) {
  c10::cuda::CUDAGuard guard(bytes.device());
  const CodecSpec s = cudaSpec(bits, groupSize, symmetric, raw);
  at::Tensor b = bytes.contiguous();
  at::Tensor o = into ? *into : at::empty({n}, b.options().dtype(at::kFloat));
  TORCH_CHECK_VALUE(
      o.is_cuda() && o.scalar_type() == at::kFloat && o.is_contiguous() && o.numel() == n,
      "[qcomm] codec: `out` must be a contiguous fp32 CUDA tensor of ", n, " elements");
  // an encoded block's scales are floats, read where the block starts
  TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(b.data_ptr()) % 4 == 0,
                    "[qcomm] codec: an encoded block must start at a multiple of 4 bytes");
  check(gpu::decode(b.data_ptr<uint8_t>(), n, s, o.data_ptr<float>(), accumulate,
                    at::cuda::getCurrentCUDAStream()),
        "decode");
  return o;
}
#endif

// The wire bytes of x (any shape, read flat). rotate: the rotated codec (encodeRotatedBlock,
// whole groups; with bits 0 it stores the rotated values as fp32). CUDA tensors: the kernels,
// neither rotate nor out.
at::Tensor codecEncode(const at::Tensor& x, int bits, int groupSize, bool symmetric,
                       const py::object& noiseSalt, int64_t noiseBase, bool rotate,
                       const c10::optional<at::Tensor>& into) {
  if (x.is_cuda()) {
#ifdef QCOMM_WITH_CUDA
    TORCH_CHECK_VALUE(!rotate && !into, "[qcomm] codec: CUDA tensors take neither rotate nor out");
    return cudaEncode(x, bits, groupSize, symmetric, noiseSalt, noiseBase);
#else
    TORCH_CHECK_VALUE(false, "[qcomm] codec: this build of qcomm has no CUDA kernels");
#endif
  }
  TORCH_CHECK_VALUE(x.device().is_cpu(), "[qcomm] codec: CPU or CUDA tensors, not ", x.device());
  at::Tensor c = x.contiguous().view({-1});
  const CodecSpec spec =
      codecSpec(bits, groupSize, symmetric, rotate ? at::kFloat : c.scalar_type());
  // every byte is written
  at::Tensor out = outputOf(into, encodedBytes(c.numel(), spec), at::kByte);
  const Noise noise = noiseOf(noiseSalt, noiseBase);
  if (rotate) {
    encodeRotatedBlock(c.data_ptr(), dtypeCode(c.scalar_type()), c.numel(), spec,
                       out.data_ptr<uint8_t>(), noise);
  } else {
    encodeBlock(c.data_ptr(), dtypeCode(c.scalar_type()), c.numel(), spec, out.data_ptr<uint8_t>(),
                noise);
  }
  return out;
}

// Wire bytes of n elements decoded to fp32 (rotate: and each group rotated back). accumulate:
// out += the decoded values (out must be given). streamed: non-temporal stores (CPU, the gather
// phase's decode of large results). CUDA bytes: the kernels, out and accumulate only.
at::Tensor codecDecode(const at::Tensor& bytes, int64_t n, int bits, int groupSize, bool symmetric,
                       at::ScalarType raw, bool rotate, const c10::optional<at::Tensor>& into,
                       bool accumulate, bool streamed) {
  const CodecSpec spec = codecSpec(bits, groupSize, symmetric, raw);
  TORCH_CHECK_VALUE(bytes.scalar_type() == at::kByte && bytes.numel() == encodedBytes(n, spec),
                    "[qcomm] codec: expected ", encodedBytes(n, spec), " bytes (uint8)");
  TORCH_CHECK_VALUE(!accumulate || (into && !rotate),
                    "[qcomm] codec: accumulate=True adds into out= (not rotated)");
  if (bytes.is_cuda()) {
#ifdef QCOMM_WITH_CUDA
    TORCH_CHECK_VALUE(!rotate && !streamed,
                      "[qcomm] codec: CUDA tensors take neither rotate nor streamed");
    return cudaDecode(bytes, n, bits, groupSize, symmetric, raw, into, accumulate);
#else
    TORCH_CHECK_VALUE(false, "[qcomm] codec: this build of qcomm has no CUDA kernels");
#endif
  }
  TORCH_CHECK_VALUE(bytes.device().is_cpu(), "[qcomm] codec: CPU or CUDA tensors, not ",
                    bytes.device());
  TORCH_CHECK_VALUE(!streamed || (!accumulate && !rotate),
                    "[qcomm] codec: streamed=True overwrites (not accumulate, not rotated)");
  at::Tensor b = bytes.contiguous();
  at::Tensor out = outputOf(into, n, at::kFloat);
  if (rotate) {
    decodeRotatedBlock(b.data_ptr<uint8_t>(), n, spec, out.data_ptr<float>());
  } else if (streamed) {
    decodeBlockStreamed(b.data_ptr<uint8_t>(), n, spec, out.data_ptr<float>());
  } else {
    decodeBlock(b.data_ptr<uint8_t>(), n, spec, out.data_ptr<float>(), accumulate);
  }
  return out;
}

// The sum, in fp32 in list order, of the decoded values of blocks (CPU; CpuCodecOps::decodeSum,
// two_step's sum of the ranks' copies), added to out= with accumulate.
at::Tensor codecDecodeSum(const std::vector<at::Tensor>& blocks, int64_t n, int bits, int groupSize,
                          bool symmetric, at::ScalarType raw, const c10::optional<at::Tensor>& into,
                          bool accumulate) {
  const CodecSpec spec = codecSpec(bits, groupSize, symmetric, raw);
  TORCH_CHECK_VALUE(!blocks.empty(), "[qcomm] codec decode_sum: no block to sum");
  TORCH_CHECK_VALUE(!accumulate || into,
                    "[qcomm] codec decode_sum: accumulate=True adds into out=");
  std::vector<at::Tensor> held;
  for (const at::Tensor& b : blocks) {
    TORCH_CHECK_VALUE(
        b.device().is_cpu() && b.scalar_type() == at::kByte && b.numel() == encodedBytes(n, spec),
        "[qcomm] codec decode_sum: expected ", encodedBytes(n, spec),
        " bytes (uint8, CPU) per block");
    held.push_back(b.contiguous());
  }
  at::Tensor out = outputOf(into, n, at::kFloat);
  CpuCodecOps ops;
  ops.decodeSum([&](int j) { return held[size_t(j)].data_ptr<uint8_t>(); }, int(held.size()), n,
                spec, out.data_ptr<float>(), accumulate);
  return out;
}

// One ring hop through the CodecOps of local's device (CPU loops, or CUDA kernels on the current
// stream): partial = decode(src) + local, dst = encode(partial). Both codecs carry local's dtype
// as their raw dtype, as a plan's do. Returns (partial, dst); partial_out and out (CPU) receive
// them instead of new tensors.
std::tuple<at::Tensor, at::Tensor> codecRingHop(const at::Tensor& src, int inBits,
                                                const at::Tensor& local, int outBits, int groupSize,
                                                bool symmetric, const py::object& noiseSalt,
                                                int64_t noiseBase,
                                                const c10::optional<at::Tensor>& intoPartial,
                                                const c10::optional<at::Tensor>& intoDst) {
  const c10::DeviceGuard guard(local.device());
  at::Tensor l = local.contiguous().view({-1});
  const int64_t n = l.numel();
  const CodecSpec in = codecSpec(inBits, groupSize, symmetric, l.scalar_type());
  const CodecSpec out = codecSpec(outBits, groupSize, symmetric, l.scalar_type());
  TORCH_CHECK_VALUE(src.device() == l.device() && src.scalar_type() == at::kByte &&
                        src.numel() == encodedBytes(n, in),
                    "[qcomm] codec ring_hop: expected ", encodedBytes(n, in), " bytes on ",
                    l.device());
  at::Tensor s = src.contiguous();
  at::Tensor partial = intoPartial && l.device().is_cpu()
                           ? outputOf(intoPartial, n, at::kFloat)
                           : at::empty({n}, l.options().dtype(at::kFloat));
  at::Tensor dst = intoDst && l.device().is_cpu()
                       ? outputOf(intoDst, encodedBytes(n, out), at::kByte)
                       : at::empty({encodedBytes(n, out)}, l.options().dtype(at::kByte));
  codecOpsFor(l.device())
      ->decodeAddEncode(s.data_ptr<uint8_t>(), in, l.data_ptr(), in.rawDtype, n,
                        partial.data_ptr<float>(), out, dst.data_ptr<uint8_t>(),
                        noiseOf(noiseSalt, noiseBase));
  return {partial, dst};
}

}  // namespace

void registerCodec(py::module& m) {
  m.def("codec_encode", &codecEncode, py::arg("x"), py::arg("bits"), py::arg("group_size"),
        py::arg("symmetric"), py::arg("noise_salt") = py::none(), py::arg("noise_base") = 0,
        py::arg("rotate") = false, py::arg("out") = py::none());
  m.def("codec_decode", &codecDecode, py::arg("bytes"), py::arg("numel"), py::arg("bits"),
        py::arg("group_size"), py::arg("symmetric"), py::arg("raw_dtype") = at::kFloat,
        py::arg("rotate") = false, py::arg("out") = py::none(), py::arg("accumulate") = false,
        py::arg("streamed") = false);
  m.def("codec_decode_sum", &codecDecodeSum, py::arg("blocks"), py::arg("numel"), py::arg("bits"),
        py::arg("group_size"), py::arg("symmetric"), py::arg("raw_dtype") = at::kFloat,
        py::arg("out") = py::none(), py::arg("accumulate") = false);
  m.def("codec_ring_hop", &codecRingHop, py::arg("src"), py::arg("in_bits"), py::arg("local"),
        py::arg("out_bits"), py::arg("group_size"), py::arg("symmetric"),
        py::arg("noise_salt") = py::none(), py::arg("noise_base") = 0,
        py::arg("partial_out") = py::none(), py::arg("out") = py::none());
  m.def(
      "encoded_bytes",
      [](int64_t n, int bits, int groupSize, bool symmetric, at::ScalarType raw) {
        return encodedBytes(n, codecSpec(bits, groupSize, symmetric, raw));
      },
      py::arg("numel"), py::arg("bits"), py::arg("group_size"), py::arg("symmetric"),
      py::arg("raw_dtype") = at::kFloat);
}

}  // namespace qcomm
