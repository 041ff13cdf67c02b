// CPU loops over the shared codec: each loop walks whole groups, threaded with at::parallel_for.
#include "codec/codec_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/codec_cpu_isa.h"
#include "common/settings.h"

namespace qcomm {
namespace {

// Groups per parallel task: 256 groups of 128 elements is 32K elements, enough work to amortise a
// task hand-off and small enough that a 1 MiB message still uses two cores.
constexpr int64_t kGroupsPerTask = 256;
constexpr int64_t kElemsPerTask = 1 << 15;

template <class F>
void forGroupRanges(int64_t groups, F&& f) {
  at::parallel_for(0, groups, kGroupsPerTask, [&](int64_t begin, int64_t end) { f(begin, end); });
}

template <class F>
void forGroups(int64_t groups, F&& f) {
  forGroupRanges(groups, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) f(g);
  });
}

template <class F>
void forElems(int64_t n, F&& f) {
  at::parallel_for(0, n, kElemsPerTask, [&](int64_t begin, int64_t end) { f(begin, end); });
}

// ---- the group loops, compiled once per instruction set and chosen at run time ----
//
// codec_cpu_loops.h compiled for the baseline x86-64, for AVX2 and for AVX-512 (one unit each,
// codec_cpu_isa.h's tables). The results are the same bits: every operation is an IEEE
// single-precision one, rounded to nearest the same way at every vector width, contraction stays
// off (setup.py -ffp-contract=off; FMAs are explicit and give codec.h's divideByScale, RN(x / s)
// exactly), and the reductions are min/max, which do not depend on order (codec.h groupParams).
// tests/codec/test_cpu_isa.py compares every instruction set this CPU has with the reference model.

struct IsaLoops {
  const GroupLoops* loops;
  bool (*supported)();
};

bool always() { return true; }

#if defined(__x86_64__) && defined(__GNUC__)
// The CPU's instructions, read here, in code compiled for the baseline: the AVX units' code never
// runs unless these say it can.
bool hasAvx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c");
}
bool hasAvx512() {
  return hasAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

constexpr IsaLoops kLoops[] = {
    {&kGenericLoops, always}, {&kAvx2Loops, hasAvx2}, {&kAvx512Loops, hasAvx512}};
#else
constexpr IsaLoops kLoops[] = {{&kGenericLoops, always}};
#endif
constexpr int kNumLoops = int(sizeof(kLoops) / sizeof(kLoops[0]));

int loopsIndex(const std::string& name) {
  for (int i = 0; i < kNumLoops; ++i) {
    if (name == kLoops[i].loops->name) return i;
  }
  return -1;
}

// The index of the loops named `name` ("auto": the widest this CPU has); an unknown name, or one
// this CPU lacks, is an error naming `what`, the value and what is allowed.
int selectCpuIsa(const std::string& name, const char* what) {
  std::string have;
  int best = 0;
  for (int i = 0; i < kNumLoops; ++i) {
    if (!kLoops[i].supported()) continue;
    have += std::string(have.empty() ? "" : ", ") + kLoops[i].loops->name;
    best = i;
  }
  if (name == "auto") return best;
  const int i = loopsIndex(name);
  if (i < 0 || !kLoops[i].supported()) {
    throw std::invalid_argument(std::string("qcomm: invalid ") + what + "='" + name + "' (" +
                                (i < 0 ? "not an instruction set" : "not available on this CPU") +
                                "); allowed: auto, " + have);
  }
  return i;
}

// The loops every codec call uses: QCOMM_CPU_ISA at the first call (unset or "auto": the widest
// this CPU has), or setCpuIsa's.
std::atomic<int> chosenLoops{-1};

const GroupLoops& groupLoops() {
  int i = chosenLoops.load(std::memory_order_acquire);
  if (i < 0) {
    i = selectCpuIsa(settings::text("QCOMM_CPU_ISA"), "QCOMM_CPU_ISA");
    int expected = -1;
    if (!chosenLoops.compare_exchange_strong(expected, i)) i = expected;
  }
  return *kLoops[i].loops;
}

// bits 0: the elements cast to c.rawDtype
template <class T>
void encodeRaw(const T* x, int64_t n, const CodecSpec& c, uint8_t* dst) {
  switch (c.rawDtype) {
    case kFloat32:
      forElems(n, [&](int64_t b, int64_t e) {
        float* o = reinterpret_cast<float*>(dst);
        for (int64_t i = b; i < e; ++i) o[i] = toFloat(x[i]);
      });
      return;
    case kFloat16:
      forElems(n, [&](int64_t b, int64_t e) {
        fp16_t* o = reinterpret_cast<fp16_t*>(dst);
        for (int64_t i = b; i < e; ++i) o[i] = fromFloat<fp16_t>(toFloat(x[i]));
      });
      return;
    default:
      forElems(n, [&](int64_t b, int64_t e) {
        bf16_t* o = reinterpret_cast<bf16_t*>(dst);
        for (int64_t i = b; i < e; ++i) o[i] = fromFloat<bf16_t>(toFloat(x[i]));
      });
      return;
  }
}

// f(x as a pointer to the elements of `dtype`)
template <class F>
void withElements(const void* x, int32_t dtype, F&& f) {
  switch (dtype) {
    case kFloat32:
      f(static_cast<const float*>(x));
      break;
    case kFloat16:
      f(static_cast<const fp16_t*>(x));
      break;
    default:
      f(static_cast<const bf16_t*>(x));
  }
}

// out[i] = float(x[i]) (out[i] + float(x[i]) with accumulate), x of `dtype`
void toFloatDispatch(const void* x, int32_t dtype, int64_t n, float* out, bool accumulate) {
  const auto widen = groupLoops().widen;
  forElems(n, [&](int64_t b, int64_t e) { widen(x, dtype, b, e, out, accumulate); });
}

}  // namespace

void encodeBlock(const void* x, int32_t dtype, int64_t n, const CodecSpec& c, uint8_t* dst,
                 const Noise& noise) {
  if (n == 0) return;
  if (c.bits == 0) {
    withElements(x, dtype, [&](auto* p) { encodeRaw(p, n, c, dst); });
    return;
  }
  // The padding between metadata and data is zeroed so the wire bytes are fully determined.
  const int64_t meta = metaBytes(n, c);
  std::memset(dst + meta, 0, size_t(dataOffset(n, c) - meta));
  const auto encode = groupLoops().encode;
  forGroupRanges(numGroups(n, c),
                 [&](int64_t g0, int64_t g1) { encode(x, dtype, n, c, g0, g1, dst, noise); });
}

void decodeBlock(const uint8_t* src, int64_t n, const CodecSpec& c, float* out, bool accumulate) {
  if (n == 0) return;
  if (c.bits == 0) {
    toFloatDispatch(src, c.rawDtype, n, out, accumulate);
    return;
  }
  const auto decode = groupLoops().decode;
  forGroupRanges(numGroups(n, c),
                 [&](int64_t g0, int64_t g1) { decode(src, n, c, g0, g1, out, accumulate); });
}

void decodeBlockStreamed(const uint8_t* src, int64_t n, const CodecSpec& c, float* out) {
  if (c.bits == 0 || reinterpret_cast<uintptr_t>(out) % 32 != 0) {
    decodeBlock(src, n, c, out, false);
    return;
  }
  if (n == 0) return;
  const auto decode = groupLoops().decodeStreamed;
  forGroupRanges(numGroups(n, c), [&](int64_t g0, int64_t g1) { decode(src, n, c, g0, g1, out); });
}

void decodeSumBlock(const uint8_t* const* srcs, int count, int64_t n, const CodecSpec& c,
                    float* out, bool accumulate) {
  if (n == 0 || count == 0) return;
  if (c.bits == 0) {
    for (int j = 0; j < count; ++j) {
      toFloatDispatch(srcs[j], c.rawDtype, n, out, accumulate || j > 0);
    }
    return;
  }
  const auto sum = groupLoops().decodeSum;
  forGroupRanges(numGroups(n, c),
                 [&](int64_t g0, int64_t g1) { sum(srcs, count, n, c, g0, g1, out, accumulate); });
}

// Elements per piece of the fused hop: a multiple of every group size (1024 at most), and 64 KiB
// of fp32 partial sums, which stay in L2 between the decode and the encode.
constexpr int64_t kHopPieceElems = 1 << 14;

void decodeAddEncodeBlock(const uint8_t* src, const CodecSpec& in, const void* local,
                          int32_t localDtype, int64_t n, float* partial, const CodecSpec& out,
                          uint8_t* dst, const Noise& noise) {
  if (n == 0) return;
  if (in.bits == 0 || out.bits == 0) {
    // a raw phase: the two passes (decode with add, then encode)
    const bool inPlace = localDtype == kFloat32 && static_cast<const void*>(partial) == local;
    decodeBlock(src, n, in, partial, inPlace);
    if (!inPlace) addToFloat(local, localDtype, n, partial);
    encodeBlock(partial, kFloat32, n, out, dst, noise);
    return;
  }
  const int64_t meta = metaBytes(n, out);
  std::memset(dst + meta, 0, size_t(dataOffset(n, out) - meta));
  const GroupLoops& loops = groupLoops();
  const bool inPlace = localDtype == kFloat32 && static_cast<const void*>(partial) == local;
  const int64_t pieces = (n + kHopPieceElems - 1) / kHopPieceElems;
  at::parallel_for(0, pieces, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t e0 = k * kHopPieceElems;
      const int64_t e1 = std::min(n, e0 + kHopPieceElems);
      // partial[e0..e1) = decoded + local, in that order (CodecOps::decodeAdd's bits), then the
      // same elements encoded while they are in cache; pieces hold whole groups of both codecs
      loops.decode(src, n, in, e0 / in.groupSize, (e1 + in.groupSize - 1) / in.groupSize, partial,
                   inPlace);
      if (!inPlace) loops.widen(local, localDtype, e0, e1, partial, true);
      loops.encode(partial, kFloat32, n, out, e0 / out.groupSize,
                   (e1 + out.groupSize - 1) / out.groupSize, dst, noise);
    }
  });
}

std::vector<std::string> cpuIsas() {
  std::vector<std::string> out;
  for (int i = 0; i < kNumLoops; ++i) {
    if (kLoops[i].supported()) out.push_back(kLoops[i].loops->name);
  }
  return out;
}

std::string cpuIsa() { return groupLoops().name; }

std::string setCpuIsa(const std::string& name) {
  const std::string before = cpuIsa();
  chosenLoops.store(selectCpuIsa(name, "cpu isa"), std::memory_order_release);
  return before;
}

void addToFloat(const void* x, int32_t dtype, int64_t n, float* acc) {
  toFloatDispatch(x, dtype, n, acc, true);
}

void castToFloat(const void* x, int32_t dtype, int64_t n, float* out) {
  toFloatDispatch(x, dtype, n, out, false);
}

namespace {
void requireWholeGroups(int64_t n, int groupSize, const char* what) {
  if (n % groupSize != 0) {
    throw std::invalid_argument(std::string("qcomm: ") + what + " of " + std::to_string(n) +
                                " elements: rotated blocks hold whole groups of " +
                                std::to_string(groupSize));
  }
}
}  // namespace

void rotateToFloat(const void* x, int32_t dtype, int64_t n, int groupSize, float* out) {
  requireWholeGroups(n, groupSize, "rotation");
  const auto rotate = groupLoops().rotate;
  forGroupRanges(n / groupSize,
                 [&](int64_t g0, int64_t g1) { rotate(x, dtype, groupSize, g0, g1, out); });
}

void encodeRotatedBlock(const void* x, int32_t dtype, int64_t n, const CodecSpec& c, uint8_t* dst,
                        const Noise& noise) {
  if (n == 0) return;
  requireWholeGroups(n, c.groupSize, "rotated encode");
  if (c.bits == 0) {
    // raw: the rotated values in c.rawDtype, a group at a time through a local buffer
    withElements(x, dtype, [&](auto* p) {
      forGroups(n / c.groupSize, [&](int64_t g) {
        float buf[kMaxGroupSize];
        rotateGroupInto(p + g * c.groupSize, c.groupSize, buf);
        uint8_t* out = dst + g * c.groupSize * dtypeBytes(c.rawDtype);
        for (int i = 0; i < c.groupSize; ++i) {
          if (c.rawDtype == kFloat32) {
            reinterpret_cast<float*>(out)[i] = buf[i];
          } else if (c.rawDtype == kFloat16) {
            reinterpret_cast<fp16_t*>(out)[i] = fromFloat<fp16_t>(buf[i]);
          } else {
            reinterpret_cast<bf16_t*>(out)[i] = fromFloat<bf16_t>(buf[i]);
          }
        }
      });
    });
    return;
  }
  const int64_t meta = metaBytes(n, c);
  std::memset(dst + meta, 0, size_t(dataOffset(n, c) - meta));
  const auto encode = groupLoops().encodeRotated;
  forGroupRanges(numGroups(n, c),
                 [&](int64_t g0, int64_t g1) { encode(x, dtype, n, c, g0, g1, dst, noise); });
}

void decodeRotatedBlock(const uint8_t* src, int64_t n, const CodecSpec& c, float* out) {
  if (n == 0) return;
  requireWholeGroups(n, c.groupSize, "rotated decode");
  if (c.bits == 0) {
    withElements(src, c.rawDtype, [&](auto* p) {
      forGroups(n / c.groupSize, [&](int64_t g) {
        float buf[kMaxGroupSize];
        const auto* in = p + g * c.groupSize;
        for (int i = 0; i < c.groupSize; ++i) buf[i] = toFloat(in[i]);
        unrotateGroupInto(buf, c.groupSize, out + g * c.groupSize);
      });
    });
    return;
  }
  const auto decode = groupLoops().decodeRotated;
  forGroupRanges(numGroups(n, c), [&](int64_t g0, int64_t g1) { decode(src, n, c, g0, g1, out); });
}

void divideBy(float* x, int64_t n, float divisor) {
  forElems(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] = x[i] / divisor;
  });
}

void multiplyBy(float* x, int64_t n, float factor) {
  forElems(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] = x[i] * factor;
  });
}

void castFromFloat(const float* x, int64_t n, int32_t dtype, void* out) {
  CodecSpec raw{0, 32, 1, dtype};
  encodeRaw(x, n, raw, static_cast<uint8_t*>(out));
}

}  // namespace qcomm
