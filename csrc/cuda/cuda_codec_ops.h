// CudaCodecOps: the CodecOps of the algorithms (csrc/algo/) over the CUDA codec kernels
// (codec_kernels.h), every operation enqueued on one stream, none blocking the host. No torch.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "codec/codec_ops.h"

namespace qcomm {

// The CUDA kernels enqueued on `stream` of the current device. A launch that fails throws
// std::runtime_error naming the kernel.
std::unique_ptr<CodecOps> makeCudaCodecOps(cudaStream_t stream);

}  // namespace qcomm
