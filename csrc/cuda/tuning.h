// The codec kernels' tuned launch choices, in one place: what an H200 measured fastest
// (benchmarks/results/05-gpu-codec-kernels.md), and the two settings that force another
// shape, QCOMM_CUDA_FULL_GRID (auto, 0, 1) and QCOMM_CUDA_ENCODE_BLOCKS (auto, 3, 4), declared in
// common/settings.cpp and read through settings::text (cached per process; "auto", like unset, is
// the measured choice). A choice changes the launch only, never a byte: every codec kernel is
// grid-stride. Host code, no torch: codec_kernels.cu decides with these functions, and the SIMT
// driver (tests/native/simt/codec_main.cpp) checks them. The variants that lost (L2 prefetch,
// staged encoders, 8 decoder items per thread; results/05 "The launch variants that lost") were
// removed; the tag experiments-before-removal-2026-12-01 holds them.
#pragma once

#include <cstdint>
#include <string>

#include "common/dtype.h"
#include "common/settings.h"

namespace qcomm {
namespace gpu {
namespace tuning {

// Elements from which the launches measured faster on the full grid take it: 40 MiB of fp32,
// between 32 MiB (lost, 0.88-0.99x) and 48 MiB (won, 1.01-1.11x); results/05 "defaults that won".
constexpr int64_t kFullGridFrom = int64_t(10) << 20;

// Encoder blocks per SM (its __launch_bounds__) by input dtype and codec; results/05,
// "The launch defaults that won":
// fp32: 4, with the full grid 0.99-1.07x the speed of 3 on the resident grid, 48 MiB to 1 GiB;
constexpr int kEncodeBlocksFp32 = 4;
// fp32 8-bit asymmetric: 3, as its 4-block build spills (64 registers) and ran 0.88-0.96x;
constexpr int kEncodeBlocksFp32Asym8 = 3;
// fp16 and bf16: 3, as their 4-block builds spill in every codec and ran 0.86-1.08x.
constexpr int kEncodeBlocks16Bit = 3;

// The codec launches, as far as the full grid is concerned.
enum class Launch {
  kDecode,   // gpu::decode's decoder: the full grid won, 1.03-1.11x from 48 MiB up
  kEncode4,  // an encoder compiled for 4 blocks per SM: the full grid won, 1.01-1.11x
  kEncode3,  // an encoder compiled for 3 blocks: mixed, 0.93-1.05x fp32, 0.86-0.97x bf16
  kOther,    // casts, the ring hop, the owners' decode-sum, AVG's division: not measured faster
};

// Whether the full grid was measured faster for `launch` (from kFullGridFrom elements).
constexpr bool fullGridWins(Launch launch) {
  return launch == Launch::kDecode || launch == Launch::kEncode4;
}

// The measured encoder blocks per SM for `dtype` input and codec (bits, symmetric).
constexpr int measuredEncodeBlocks(int32_t dtype, int bits, bool symmetric) {
  return dtype != kFloat32           ? kEncodeBlocks16Bit
         : (bits == 8 && !symmetric) ? kEncodeBlocksFp32Asym8
                                     : kEncodeBlocksFp32;
}

// The blocks per SM (3 or 4) of the encoder to launch: QCOMM_CUDA_ENCODE_BLOCKS when 3 or 4,
// else the measured choice. Throws std::invalid_argument for an invalid value of the setting.
inline int encodeBlocks(int32_t dtype, int bits, bool symmetric) {
  const std::string s = settings::text("QCOMM_CUDA_ENCODE_BLOCKS");
  if (s == "3") return 3;
  if (s == "4") return 4;
  return measuredEncodeBlocks(dtype, bits, symmetric);
}

// Whether a `launch` over n elements takes the full grid (every block the work needs, one turn of
// its loop each) rather than the resident grid balanced over turns: QCOMM_CUDA_FULL_GRID when 0
// or 1, else from kFullGridFrom elements where the full grid won. Throws std::invalid_argument for
// an invalid value of the setting.
inline bool fullGrid(Launch launch, int64_t n) {
  const std::string s = settings::text("QCOMM_CUDA_FULL_GRID");
  if (s == "1") return true;
  if (s == "0") return false;
  return fullGridWins(launch) && n >= kFullGridFrom;
}

}  // namespace tuning
}  // namespace gpu
}  // namespace qcomm
