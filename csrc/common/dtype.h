// The element types qcomm handles, and the inline markers of code shared by host and device. No
// torch and no STL: the CUDA kernels include this too.
#pragma once

#include <stdint.h>

// Always inlined, on the device and on the host: codec_cpu.cpp compiles its group loops once per
// instruction set (AVX2, AVX-512, baseline), and only code inlined into those loops is compiled
// for theirs; a call out of them would run the baseline copy.
#define QCOMM_ALWAYS_INLINE inline __attribute__((always_inline))
#if defined(__CUDACC__)
#define QCOMM_HD __host__ __device__ __forceinline__
#else
#define QCOMM_HD QCOMM_ALWAYS_INLINE
#endif

namespace qcomm {

// Element types on the wire and in user tensors. The numbers are part of the C++/Python contract.
enum DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

QCOMM_HD int dtypeBytes(int32_t dtype) { return dtype == kFloat32 ? 4 : 2; }

}  // namespace qcomm
