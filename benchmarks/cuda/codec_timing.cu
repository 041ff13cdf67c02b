// The codec kernels timed without torch or Python: encode and decode of fp32 (or, with --dtype,
// bf16 or fp16) messages, group 128,
// 8/4 bits, asymmetric/symmetric, against cudaMemcpyAsync device to device (bytes read plus
// written, as benchmarks/cuda_codec_bench.py counts them), in the default launch and in the
// launch variants that QCOMM_CUDA_FULL_GRID and QCOMM_CUDA_ENCODE_BLOCKS force (kVariants below;
// a variant that changes only one of the two kernels times the other as the default runs it;
// the settings are read once per process, so each change is followed by settings::reload()).
// Each variant's bytes and decoded values are compared with the default's. Built by
// scripts/codec_timing.sh with nvcc alone, with csrc/common/settings.cpp (no GPU needed to build,
// no build on the GPU machine: the binary runs wherever a CUDA driver is).
//
//     codec_timing [--sizes-mib 64,256,1024] [--iters 20] [--csv out.csv] [--dtype fp32|bf16|fp16]
//
// A size is the message's bytes in its own dtype; the copy moves those bytes, the decoder writes
// fp32 (as the allreduce's accumulating decodes do).
//
// Timing as in cuda_codec_bench.py: a region of `iters` back-to-back calls behind a queued sleep
// kernel (so the host's launches are not timed), its mean per call; each kernel, the copy too,
// timed in 2 turns interleaved with the others and its faster turn kept.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "../../csrc/common/settings.h"
#include "../../csrc/cuda/codec_kernels.h"

namespace {

void check(cudaError_t e, const char* what, int line) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "codec_timing.cu:%d: %s: %s\n", line, what, cudaGetErrorString(e));
    std::exit(1);
  }
}
#define CHECK(x) check((x), #x, __LINE__)

// Roughly normal values (a sum of four uniforms), a different stream per seed: no zeros, no
// repeats, so no kernel sees a shortcut a real message would not give it.
__global__ void fillKernel(float* x, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (uint32_t k = 0; k < 4; ++k) {
      s += float(qcomm::hash32(uint32_t(i) * 4u + k + qcomm::hash32(seed + uint32_t(i >> 32))) >>
                 8) *
           (1.0f / 16777216.0f);
    }
    x[i] = (s - 2.0f) * 1.7f;
  }
}

__global__ void sleepKernel(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

constexpr long long kSleepCycles = 10000000;  // about 5 ms at 1.98 GHz

struct Variant {
  const char* name;
  std::vector<std::pair<const char*, const char*>> env;
};
const char* const kSettings[] = {"QCOMM_CUDA_FULL_GRID", "QCOMM_CUDA_ENCODE_BLOCKS"};
const std::vector<Variant> kVariants = {
    {"default", {}},
    {"resident, 3 blocks", {{"QCOMM_CUDA_FULL_GRID", "0"}, {"QCOMM_CUDA_ENCODE_BLOCKS", "3"}}},
    {"resident", {{"QCOMM_CUDA_FULL_GRID", "0"}}},
    {"full grid", {{"QCOMM_CUDA_FULL_GRID", "1"}}},
    {"4 blocks", {{"QCOMM_CUDA_ENCODE_BLOCKS", "4"}}},
};

// Exactly v's settings in the environment, and the process's cached settings read again.
void apply(const Variant& v) {
  for (const char* s : kSettings) unsetenv(s);
  for (const auto& kv : v.env) setenv(kv.first, kv.second, 1);
  qcomm::settings::reload();
}

// Mean time per call, in microseconds, of `iters` calls of fn queued behind a sleep kernel.
template <class F>
double region(F fn, int iters, cudaStream_t s, cudaEvent_t a, cudaEvent_t b) {
  fn();  // warm-up (and the launch's first-time costs)
  CHECK(cudaStreamSynchronize(s));
  sleepKernel<<<1, 1, 0, s>>>(kSleepCycles);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(a, s));
  for (int i = 0; i < iters; ++i) fn();
  CHECK(cudaEventRecord(b, s));
  CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  return 1000.0 * ms / iters;
}

std::vector<int64_t> parseList(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoll(p));
    while (*p && *p != ',') ++p;
    if (*p == ',') ++p;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {64, 256, 1024};
  int iters = 20;
  const char* csvPath = nullptr;
  int32_t dtype = qcomm::kFloat32;
  const char* dtypeName = "fp32";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--sizes-mib" && i + 1 < argc) {
      sizes = parseList(argv[++i]);
    } else if (a == "--iters" && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (a == "--csv" && i + 1 < argc) {
      csvPath = argv[++i];
    } else if (a == "--dtype" && i + 1 < argc) {
      dtypeName = argv[++i];
      if (std::strcmp(dtypeName, "fp32") == 0) {
        dtype = qcomm::kFloat32;
      } else if (std::strcmp(dtypeName, "bf16") == 0) {
        dtype = qcomm::kBFloat16;
      } else if (std::strcmp(dtypeName, "fp16") == 0) {
        dtype = qcomm::kFloat16;
      } else {
        std::fprintf(stderr, "--dtype takes fp32, bf16 or fp16, not '%s'\n", dtypeName);
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: %s [--sizes-mib 64,256,1024] [--iters 20] [--csv out.csv] "
                   "[--dtype fp32|bf16|fp16]\n",
                   argv[0]);
      return 2;
    }
  }
  if (sizes.empty() || iters < 1) {
    std::fprintf(stderr, "need at least one size and one iteration\n");
    return 2;
  }
  int dev = 0;
  cudaDeviceProp prop;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaGetDeviceProperties(&prop, dev));
  std::printf(
      "# %s, %d SMs; codec_timing: %s input, group 128; each time the faster of 2 turns of %d "
      "calls\n",
      prop.name, prop.multiProcessorCount, dtypeName, iters);
  FILE* csv = csvPath ? std::fopen(csvPath, "w") : nullptr;
  if (csvPath && !csv) {
    std::fprintf(stderr, "cannot write %s\n", csvPath);
    return 2;
  }
  if (csv) std::fprintf(csv, "MiB,kernel,bits,scale,variant,time_us,copy_us,x copy,same bits\n");
  std::printf("| MiB | kernel | bits | scale | copy us |");
  for (const Variant& v : kVariants) std::printf(" %s us (x copy) |", v.name);
  std::printf(" same bits |\n|---|---|---|---|---|");
  for (size_t k = 0; k < kVariants.size(); ++k) std::printf("---|");
  std::printf("---|\n");

  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ea, eb;
  CHECK(cudaEventCreate(&ea));
  CHECK(cudaEventCreate(&eb));
  bool allSame = true;
  for (int64_t mib : sizes) {
    const int64_t esize = dtype == qcomm::kFloat32 ? 4 : 2;
    const int64_t n = mib * (int64_t(1) << 20) / esize;
    float *x32 = nullptr, *out = nullptr, *out0 = nullptr;
    void *x = nullptr, *copyDst = nullptr;
    CHECK(cudaMalloc(&x32, n * 4));
    CHECK(cudaMalloc(&x, n * esize));
    CHECK(cudaMalloc(&copyDst, n * esize));
    CHECK(cudaMalloc(&out, n * 4));
    CHECK(cudaMalloc(&out0, n * 4));
    fillKernel<<<1024, 256, 0, s>>>(x32, n, uint32_t(mib));
    CHECK(cudaGetLastError());
    // the input in its dtype: the raw codec's cast (bits 0), rounding to nearest even
    CHECK(qcomm::gpu::encode(x32, qcomm::kFloat32, n, qcomm::CodecSpec{0, 128, 1, dtype},
                             static_cast<uint8_t*>(x), qcomm::Noise{0, 0, 0}, s));
    struct Codec {
      int bits, sym;
    };
    for (Codec cd : {Codec{8, 0}, Codec{8, 1}, Codec{4, 0}, Codec{4, 1}}) {
      const qcomm::CodecSpec c{cd.bits, 128, cd.sym, qcomm::kFloat32};
      const int64_t bytes = qcomm::encodedBytes(n, c);
      uint8_t *enc = nullptr, *enc0 = nullptr;
      CHECK(cudaMalloc(&enc, bytes));
      CHECK(cudaMalloc(&enc0, bytes));
      const qcomm::Noise noise{0, 0, 0};
      apply(kVariants[0]);  // the default's bytes and values, to compare each variant's with
      CHECK(qcomm::gpu::encode(x, dtype, n, c, enc0, noise, s));
      CHECK(qcomm::gpu::decode(enc0, n, c, out0, false, s));
      CHECK(cudaStreamSynchronize(s));
      const int V = int(kVariants.size());
      std::vector<double> encUs(V, 1e30), decUs(V, 1e30);
      double copyUs = 1e30;
      for (int turn = 0; turn < 2; ++turn) {
        apply(kVariants[0]);
        copyUs = std::min(
            copyUs,
            region(
                [&] { CHECK(cudaMemcpyAsync(copyDst, x, n * esize, cudaMemcpyDeviceToDevice, s)); },
                iters, s, ea, eb));
        for (int v = 0; v < V; ++v) {
          apply(kVariants[v]);
          encUs[v] = std::min(
              encUs[v], region([&] { CHECK(qcomm::gpu::encode(x, dtype, n, c, enc, noise, s)); },
                               iters, s, ea, eb));
          decUs[v] = std::min(
              decUs[v], region([&] { CHECK(qcomm::gpu::decode(enc0, n, c, out, false, s)); }, iters,
                               s, ea, eb));
        }
      }
      // each variant's bytes and values against the default's
      std::vector<bool> same(V, true);
      std::vector<uint8_t> h0(bytes), h1(bytes);
      std::vector<float> f0(n), f1(n);
      CHECK(cudaMemcpy(h0.data(), enc0, bytes, cudaMemcpyDeviceToHost));
      CHECK(cudaMemcpy(f0.data(), out0, n * 4, cudaMemcpyDeviceToHost));
      for (int v = 1; v < V; ++v) {
        apply(kVariants[v]);
        CHECK(cudaMemset(enc, 0xA5, bytes));
        CHECK(cudaMemset(out, 0xA5, n * 4));
        CHECK(qcomm::gpu::encode(x, dtype, n, c, enc, noise, s));
        CHECK(qcomm::gpu::decode(enc0, n, c, out, false, s));
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaMemcpy(h1.data(), enc, bytes, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(f1.data(), out, n * 4, cudaMemcpyDeviceToHost));
        same[v] = std::memcmp(h0.data(), h1.data(), bytes) == 0 &&
                  std::memcmp(f0.data(), f1.data(), n * 4) == 0;
        allSame = allSame && same[v];
      }
      apply(kVariants[0]);
      const double copyBytes = 2.0 * n * esize;
      for (int k = 0; k < 2; ++k) {
        const bool isEnc = k == 0;
        // read + written: the input and the block, or the block and fp32 values
        const double moved = double(n) * (isEnc ? esize : 4) + double(bytes);
        std::printf("| %lld | %s | %d | %s | %.1f |", (long long)mib, isEnc ? "encode" : "decode",
                    cd.bits, cd.sym ? "sym" : "asym", copyUs);
        std::string sameCell;
        for (int v = 0; v < V; ++v) {
          const double us = isEnc ? encUs[v] : decUs[v];
          const double ratio = (moved / us) / (copyBytes / copyUs);
          std::printf(" %.1f (%.2f) |", us, ratio);
          if (csv) {
            std::fprintf(csv, "%lld,%s,%d,%s,\"%s\",%.1f,%.1f,%.3f,%s\n", (long long)mib,
                         isEnc ? "encode" : "decode", cd.bits, cd.sym ? "sym" : "asym",
                         kVariants[v].name, us, copyUs, ratio, same[v] ? "yes" : "NO");
          }
          if (v > 0 && !same[v])
            sameCell += std::string(sameCell.empty() ? "" : ", ") + "NOT " + kVariants[v].name;
        }
        std::printf(" %s |\n", sameCell.empty() ? "yes" : sameCell.c_str());
        std::fflush(stdout);
      }
      if (csv) std::fflush(csv);
      CHECK(cudaFree(enc));
      CHECK(cudaFree(enc0));
    }
    CHECK(cudaFree(x));
    CHECK(cudaFree(x32));
    CHECK(cudaFree(copyDst));
    CHECK(cudaFree(out));
    CHECK(cudaFree(out0));
  }
  if (csv) std::fclose(csv);
  std::printf("%s\n", allSame ? "every variant: the default's bytes and values"
                              : "SOME VARIANT DIFFERS from the default's bytes or values");
  return allSame ? 0 : 1;
}
