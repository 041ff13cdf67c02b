// Self-test of the SIMT emulator (simt.h): kernels whose results are known, and kernels with the
// bugs the emulator must refuse. `selftest ok` runs the good ones and prints "selftest ok";
// `selftest divergent|exit|deadlock|named|unwaited|outside|race` runs one bad kernel, which must
// abort with the message tests/test_simt_emulation.py expects (`race` under SIMT_TSAN=1 only).
#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda/launch.cuh"
#include "cuda/tile_codec.cuh"

namespace {

// Each warp sums its lanes' values with xor shuffles; every lane must see the warp's total.
__global__ void warpSum(const int* in, int* out) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  int v = in[i];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[i] = v;
}

// Shared memory is per block, and __syncthreads orders its writes before the reads.
__global__ void reverseInBlock(const int* in, int* out) {
  __shared__ int tile[256];
  const int base = blockIdx.x * blockDim.x;
  tile[threadIdx.x] = in[base + threadIdx.x];
  __syncthreads();
  out[base + threadIdx.x] = tile[blockDim.x - 1 - threadIdx.x];
}

// Named barriers (bar.sync id, count): each half of the block reverses its own 128 threads'
// words, at its own barrier, without the other half.
__global__ void reverseInHalves(const int* in, int* out) {
  __shared__ int tile[256];
  const int half = int(threadIdx.x) / 128;
  tile[threadIdx.x] = in[threadIdx.x];
  qcomm::simt::namedBarrier(1 + half, 128);
  out[threadIdx.x] = tile[half * 128 + 127 - int(threadIdx.x) % 128];
}

__global__ void ballotOdd(unsigned* out) {
  const unsigned b = __ballot_sync(0xffffffffu, threadIdx.x & 1);
  if (threadIdx.x % 32 == 0) out[threadIdx.x / 32] = b;
}

// Bugs: half a warp at a shuffle, the other half at a ballot; a lane that leaves before a
// shuffle; part of a warp at a shuffle while the rest of the block waits at __syncthreads.
__global__ void divergent(int* out) {
  if (threadIdx.x % 32 < 16) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
  } else {
    out[threadIdx.x] = int(__ballot_sync(0xffffffffu, 1));
  }
}

__global__ void earlyExit(int* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);
}

// Two warps meet at barrier 1, one counting 64 threads, the other 32.
__global__ void namedMismatch(int* out) {
  qcomm::simt::namedBarrier(1, threadIdx.x < 32 ? 64 : 32);
  out[threadIdx.x] = 1;
}

__global__ void deadlock(int* out) {
  if (threadIdx.x < 16) {
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);  // waits for lanes 16..31 forever
  } else {
    __syncthreads();  // waits for lanes 0..15 forever
  }
}

// A race: each thread reads its neighbour's shared word with no barrier between (under
// SIMT_TSAN=1 the emulator must report it, whatever order the fibers ran in).
__global__ void race(int* out) {
  __shared__ int tile[64];
  tile[threadIdx.x] = int(threadIdx.x);
  out[threadIdx.x] = tile[(threadIdx.x + 1) % 64];
}

// cp.async through dynamic shared memory (64 bytes per thread): each thread copies four 16-byte
// lines in two groups, waits for the older group only, then for both; `early` also records what
// the newer group's line read before its wait (still 0xff bytes under the emulator).
__global__ void stagedCopy(const int* in, int* out, int* early) {
  int* stage = reinterpret_cast<int*>(qcomm::gpu::dynamicShared()) + 16 * threadIdx.x;
  const int* src = in + 16 * (blockIdx.x * blockDim.x + threadIdx.x);
  qcomm::gpu::copyAsync16(stage, src);
  qcomm::gpu::copyAsync16(stage + 4, src + 4);
  qcomm::gpu::copyAsyncCommit();
  qcomm::gpu::copyAsync16(stage + 8, src + 8);
  qcomm::gpu::copyAsync16(stage + 12, src + 12);
  qcomm::gpu::copyAsyncCommit();
  qcomm::gpu::copyAsyncWait<1>();
  int* o = out + 16 * (blockIdx.x * blockDim.x + threadIdx.x);
  for (int k = 0; k < 8; ++k) o[k] = stage[k];
  early[blockIdx.x * blockDim.x + threadIdx.x] = stage[8];
  qcomm::gpu::copyAsyncWait<0>();
  for (int k = 8; k < 16; ++k) o[k] = stage[k];
}

// Bugs: a thread that exits with a copy it never waited for; a copy to outside dynamic shared
// memory.
__global__ void unwaitedCopy(int* out) {
  qcomm::gpu::copyAsync16(qcomm::gpu::dynamicShared() + 16 * threadIdx.x, out + 4 * threadIdx.x);
  qcomm::gpu::copyAsyncCommit();
}

__global__ void copyOutsideShared(int* out) {
  qcomm::gpu::copyAsync16(out + 4 * threadIdx.x, out);
  qcomm::gpu::copyAsyncWait<0>();
}

bool good() {
  const int n = 3 * 256;
  std::vector<int> in(n), out(n, -1);
  for (int i = 0; i < n; ++i) in[size_t(i)] = i * 7 % 11;
  QCOMM_LAUNCH(warpSum, 3, 256, nullptr)(in.data(), out.data());
  for (int w = 0; w < n / 32; ++w) {
    int sum = 0;
    for (int l = 0; l < 32; ++l) sum += in[size_t(w * 32 + l)];
    for (int l = 0; l < 32; ++l) {
      if (out[size_t(w * 32 + l)] != sum) {
        std::printf("warpSum: lane %d of warp %d has %d, not %d\n", l, w, out[size_t(w * 32 + l)],
                    sum);
        return false;
      }
    }
  }
  QCOMM_LAUNCH(reverseInBlock, 3, 256, nullptr)(in.data(), out.data());
  for (int i = 0; i < n; ++i) {
    const int want = in[size_t(i / 256 * 256 + 255 - i % 256)];
    if (out[size_t(i)] != want) {
      std::printf("reverseInBlock: %d has %d, not %d\n", i, out[size_t(i)], want);
      return false;
    }
  }
  QCOMM_LAUNCH(reverseInHalves, 1, 256, nullptr)(in.data(), out.data());
  for (int i = 0; i < 256; ++i) {
    const int want = in[size_t(i / 128 * 128 + 127 - i % 128)];
    if (out[size_t(i)] != want) {
      std::printf("reverseInHalves: %d has %d, not %d\n", i, out[size_t(i)], want);
      return false;
    }
  }
  {
    std::vector<int> src(2 * 64 * 16), dst(src.size(), -1), early(2 * 64, 0);
    for (size_t i = 0; i < src.size(); ++i) src[i] = int(i * 13 % 97);
    QCOMM_LAUNCH_SHARED(stagedCopy, 2, 64, 64 * 64, nullptr)(src.data(), dst.data(), early.data());
    if (dst != src) {
      std::printf("stagedCopy: the copies differ from their source\n");
      return false;
    }
    for (int e : early) {
      if (e != -1) {  // 0xffffffff: the newer group was not done before its wait
        std::printf("stagedCopy: a line read before its wait held %d\n", e);
        return false;
      }
    }
  }
  std::vector<unsigned> b(8, 0);
  QCOMM_LAUNCH(ballotOdd, 1, 256, nullptr)(b.data());
  for (unsigned v : b) {
    if (v != 0xaaaaaaaau) {
      std::printf("ballot: %08x\n", v);
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const char* what = argc > 1 ? argv[1] : "ok";
  std::vector<int> out(256, 0);
  if (std::strcmp(what, "divergent") == 0) QCOMM_LAUNCH(divergent, 1, 64, nullptr)(out.data());
  if (std::strcmp(what, "exit") == 0) QCOMM_LAUNCH(earlyExit, 1, 64, nullptr)(out.data());
  if (std::strcmp(what, "deadlock") == 0) QCOMM_LAUNCH(deadlock, 1, 64, nullptr)(out.data());
  if (std::strcmp(what, "named") == 0) QCOMM_LAUNCH(namedMismatch, 1, 64, nullptr)(out.data());
  if (std::strcmp(what, "race") == 0) QCOMM_LAUNCH(race, 1, 64, nullptr)(out.data());
  if (std::strcmp(what, "unwaited") == 0) {
    QCOMM_LAUNCH_SHARED(unwaitedCopy, 1, 32, 32 * 16, nullptr)(out.data());
  }
  if (std::strcmp(what, "outside") == 0) {
    QCOMM_LAUNCH_SHARED(copyOutsideShared, 1, 32, 32 * 16, nullptr)(out.data());
  }
  if (std::strcmp(what, "ok") != 0) return 0;  // a bad kernel that was not refused
  if (!good()) return 1;
  std::printf("selftest ok\n");
  return 0;
}
