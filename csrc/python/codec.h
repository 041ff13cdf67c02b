// The codec's Python entry points (python/codec.cpp, behind qcomm/codec.py), and the argument
// checks they share with the test hooks (csrc/testing/): a tensor's codec dtype, a validated
// CodecSpec, the noise of stochastic rounding, a caller's output tensor, a device's CodecOps.
#pragma once

#include <pybind11/pybind11.h>
#include <torch/extension.h>

#include <memory>

#include "codec/codec.h"
#include "codec/codec_ops.h"
#include "common/torch_dtype.h"
#include "plan/config.h"
#ifdef QCOMM_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "cuda/cuda_codec_ops.h"
#endif

namespace qcomm {

inline int32_t dtypeCode(at::ScalarType t) {
  const int32_t code = dtypeOf(t);
  TORCH_CHECK_VALUE(code >= 0, "[qcomm] codec: dtype ", t, " is not fp32, fp16 or bf16");
  return code;
}

// bits 0 (the values in their dtype, as a phase of None ships them), 4 or 8; group_size as a
// QuantConfig allows it. A bad value is a ValueError naming it (validateConfig).
inline CodecSpec codecSpec(int bits, int groupSize, bool symmetric, at::ScalarType raw) {
  QuantConfig probe;
  probe.rsBits = bits;
  probe.groupSize = groupSize;
  validateConfig(probe);
  return CodecSpec{bits, groupSize, symmetric ? 1 : 0, dtypeCode(raw)};
}

// No noise (round to nearest) when salt is None.
inline Noise noiseOf(const pybind11::object& salt, int64_t base) {
  return Noise{salt.is_none() ? 0u : salt.cast<uint32_t>(), base, salt.is_none() ? 0 : 1};
}

// A CPU result of n elements of `dtype`: a new tensor, or the caller's `out` (a benchmark reuses
// one buffer, so that a large output's first-touch page faults are not timed with the codec).
inline at::Tensor outputOf(const c10::optional<at::Tensor>& out, int64_t n, at::ScalarType dtype) {
  if (!out) return at::empty({n}, dtype);
  TORCH_CHECK_VALUE(out->device().is_cpu() && out->scalar_type() == dtype && out->dim() == 1 &&
                        out->numel() == n && out->is_contiguous(),
                    "[qcomm] out: expected a contiguous 1-D CPU tensor of ", n, " ", dtype);
  return *out;
}

// The CodecOps of memory on `device`: the CPU loops, or the CUDA kernels on the device's current
// stream.
inline std::unique_ptr<CodecOps> codecOpsFor(const c10::Device& device) {
  if (device.is_cpu()) return std::make_unique<CpuCodecOps>();
#ifdef QCOMM_WITH_CUDA
  if (device.is_cuda()) {
    return makeCudaCodecOps(c10::cuda::getCurrentCUDAStream(device.index()).stream());
  }
#endif
  TORCH_CHECK_VALUE(false, "[qcomm] no codec for tensors on ", device,
                    device.is_cuda() ? " (this build of qcomm has no CUDA kernels)" : "");
}

// Registers the codec's entry points in qcomm._C: codec_encode, codec_decode, codec_decode_sum,
// codec_ring_hop, encoded_bytes.
void registerCodec(pybind11::module& m);

}  // namespace qcomm
