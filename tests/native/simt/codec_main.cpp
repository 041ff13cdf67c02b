// The CUDA codec kernels (csrc/cuda/codec_kernels.cu), run by the SIMT emulator, against the CPU
// codec (csrc/codec_cpu.cpp) bit for bit: wire bytes of encode, decoded values (with and without
// accumulate) and the fused ring hop (partial sums and re-encoded bytes), for every dtype, bit
// width, symmetry and group size, sizes with and without a partial last slab, aligned and
// misaligned pointers (the vector and the scalar paths), stochastic rounding, and inputs with
// non-finite values, constant groups, zeros of both signs, huge and denormal values, and groups a
// few ulps wide; the launch variants that QCOMM_CUDA_FULL_GRID and QCOMM_CUDA_ENCODE_BLOCKS force
// (the same bytes), cuda/tuning.h's choices under each, and the refusal of values they do not
// allow. Prints one line per family and exits non-zero at the first difference, naming the case
// and the byte.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/codec_cpu.h"
#include "common/settings.h"
#include "cuda/codec_kernels.h"
#include "cuda/tuning.h"

using namespace qcomm;

namespace {

int failures = 0;
int64_t cases = 0;

const char* dtypeName(int32_t d) {
  return d == kFloat32 ? "f32" : (d == kFloat16 ? "f16" : "bf16");
}

std::string describe(const char* what, int32_t dtype, const CodecSpec& c, int64_t n, int offset,
                     bool noise) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s %s bits=%d sym=%d group=%d n=%lld offset=%d noise=%d", what,
                dtypeName(dtype), c.bits, c.symmetric, c.groupSize, (long long)n, offset,
                int(noise));
  return buf;
}

bool sameBytes(const std::string& name, const uint8_t* a, const uint8_t* b, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) {
    if (a[i] != b[i]) {
      std::fprintf(stderr, "DIFFER %s: byte %zu of %zu: cpu %02x emulated %02x\n", name.c_str(), i,
                   bytes, a[i], b[i]);
      ++failures;
      return false;
    }
  }
  return true;
}

// Values in fp32 with the special cases placed at fixed spots; then rounded to the dtype.
std::vector<float> values(int64_t n, std::mt19937& gen, int variant) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = normal(gen);
  if (variant == 1 && n > 0) {
    const float big = std::numeric_limits<float>::max();
    v[0] = std::numeric_limits<float>::quiet_NaN();
    if (n > 40) v[40] = std::numeric_limits<float>::infinity();
    if (n > 300) v[300] = -std::numeric_limits<float>::infinity();
    for (int64_t i = 1024; i < n && i < 2048; ++i) v[size_t(i)] = 0.5f;  // constant groups
    for (int64_t i = 2048; i < n && i < 2304; ++i) v[size_t(i)] = (i & 1) ? 0.0f : -0.0f;
    for (int64_t i = 2304; i < n && i < 2560; ++i) v[size_t(i)] = big * std::sin(float(i));
    for (int64_t i = 2560; i < n && i < 2816; ++i) v[size_t(i)] = 1e-42f * float(i % 7 - 3);
    // groups that reach +-FLT_MAX: 127 * RN(FLT_MAX / 127) rounds to Inf, which the decoders'
    // clampToFinite must turn back into FLT_MAX
    for (int64_t i = 2816; i < n && i < 2944; ++i)
      v[size_t(i)] = (i & 1 ? big : -big) / float(1 + i % 3);
    if (n > 3000) v[3000] = 1e4f;  // an outlier
    // groups a few fp32 ulps wide: their scale is mostly rounding, so some codes fall outside
    // [0, L] before the clamp (codec.h asymCodesInRange refuses them; the encoders keep the clamp)
    for (int64_t i = 3072; i < n && i < 3584; ++i) {
      float x = i < 3328 ? 1000.0f : -0.37f;
      for (int u = int(i % 7); u > 0; --u) x = std::nextafter(x, INFINITY);
      v[size_t(i)] = x;
    }
  }
  return v;
}

// x as `dtype` elements, starting `offset` elements into the returned storage.
std::vector<uint8_t> asDtype(const std::vector<float>& v, int32_t dtype, int offset) {
  const int eb = dtypeBytes(dtype);
  std::vector<uint8_t> out(size_t((int64_t(v.size()) + offset) * eb + 16), 0);
  castFromFloat(v.data(), int64_t(v.size()), dtype, out.data() + offset * eb);
  return out;
}

void checkEncodeDecode(int32_t dtype, const CodecSpec& c, int64_t n, int offset, bool withNoise,
                       int variant, std::mt19937& gen) {
  ++cases;
  const std::string name = describe("encode", dtype, c, n, offset, withNoise);
  const std::vector<float> v = values(n, gen, variant);
  std::vector<uint8_t> x = asDtype(v, dtype, offset);
  const void* xp = x.data() + offset * dtypeBytes(dtype);
  const Noise noise{noiseSalt(uint32_t(n), 1, 0), 4096, withNoise ? 1 : 0};
  const size_t bytes = size_t(encodedBytes(n, c));
  std::vector<uint8_t> cpu(bytes + 1, 0xcd), emu(bytes + 1, 0xcd);
  encodeBlock(xp, dtype, n, c, cpu.data(), noise);
  // a misaligned destination too: the data section then takes the scalar path
  uint8_t* dst = emu.data();
  std::vector<uint8_t> shifted;
  if (offset != 0) {
    shifted.assign(bytes + 8, 0xcd);
    dst = shifted.data() + 4;
  }
  if (gpu::encode(xp, dtype, n, c, dst, noise, nullptr) != cudaSuccess) {
    std::fprintf(stderr, "FAIL %s: launch error\n", name.c_str());
    ++failures;
    return;
  }
  if (!sameBytes(name, cpu.data(), dst, bytes + (offset != 0 ? 0 : 1))) return;

  for (int acc = 0; acc < 2; ++acc) {
    const std::string dname = describe(acc ? "decode+=" : "decode", dtype, c, n, offset, withNoise);
    std::vector<float> a(size_t(n) + 1), b(size_t(n) + 1);
    for (int64_t i = 0; i <= n; ++i) a[size_t(i)] = b[size_t(i)] = float(i % 13) - 6.0f;
    float* out = b.data() + (offset != 0 ? 1 : 0);  // a misaligned output: the scalar path
    if (offset != 0) {
      for (int64_t i = 0; i < n; ++i) out[i] = a[size_t(i)];
    }
    decodeBlock(cpu.data(), n, c, a.data(), acc != 0);
    if (gpu::decode(dst, n, c, out, acc != 0, nullptr) != cudaSuccess) {
      std::fprintf(stderr, "FAIL %s: launch error\n", dname.c_str());
      ++failures;
      return;
    }
    if (!sameBytes(dname, reinterpret_cast<const uint8_t*>(a.data()),
                   reinterpret_cast<const uint8_t*>(out), size_t(n) * 4)) {
      return;
    }
  }
}

// The sum of `count` encoded blocks (gpu::decodeSum, 8 per launch) against the CPU's decode and
// decodes with accumulate, in order (accumulate: all of them with accumulate, onto values already
// in the output). misaligned: the output one float off (the scalar path), and the last block's
// data 4 bytes off (the scalar path for every block).
void checkDecodeSum(const CodecSpec& c, int count, int64_t n, bool misaligned, std::mt19937& gen,
                    bool accumulate = false) {
  ++cases;
  char extra[64];
  std::snprintf(extra, sizeof extra, " count=%d accumulate=%d", count, int(accumulate));
  const std::string name =
      describe("decode-sum", kFloat32, c, n, misaligned ? 1 : 0, false) + extra;
  const size_t bytes = size_t(encodedBytes(n, c));
  std::vector<std::vector<uint8_t>> blocks(size_t(count), std::vector<uint8_t>(bytes + 8, 0));
  std::vector<const uint8_t*> srcs;
  for (int k = 0; k < count; ++k) {
    const std::vector<float> v = values(n, gen, k % 3 == 0 ? 1 : 0);
    uint8_t* at = blocks[size_t(k)].data() + (misaligned && k == count - 1 ? 4 : 0);
    encodeBlock(v.data(), kFloat32, n, c, at, Noise{0, 0, 0});
    srcs.push_back(at);
  }
  std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n) + 1, 7.0f);
  float* out = got.data() + (misaligned ? 1 : 0);
  if (accumulate) {
    want = values(n, gen, 0);
    std::copy(want.begin(), want.end(), out);
  }
  for (int k = 0; k < count; ++k) {
    decodeBlock(srcs[size_t(k)], n, c, want.data(), accumulate || k > 0);
  }
  if (gpu::decodeSum(srcs.data(), count, n, c, out, accumulate, nullptr) != cudaSuccess) {
    std::fprintf(stderr, "FAIL %s: launch error\n", name.c_str());
    ++failures;
    return;
  }
  sameBytes(name, reinterpret_cast<const uint8_t*>(want.data()),
            reinterpret_cast<const uint8_t*>(out), size_t(n) * 4);
}

void checkHop(int32_t dtype, const CodecSpec& in, const CodecSpec& outSpec, int64_t n, bool alias,
              bool withNoise, std::mt19937& gen) {
  ++cases;
  char extra[64];
  std::snprintf(extra, sizeof extra, " in=%d/%d alias=%d", in.bits, in.symmetric, int(alias));
  const std::string name = describe("hop", dtype, outSpec, n, 0, withNoise) + extra;
  const std::vector<float> incoming = values(n, gen, 0);
  const std::vector<float> localF = values(n, gen, 1);
  std::vector<uint8_t> src(size_t(encodedBytes(n, in)));
  encodeBlock(incoming.data(), kFloat32, n, in, src.data(), Noise{0, 0, 0});
  const std::vector<uint8_t> local = asDtype(localF, dtype, 0);
  const Noise noise{noiseSalt(7, 2, 1), 128, withNoise ? 1 : 0};

  // the CPU ring hop: decode, add the local elements, encode the partial sum
  std::vector<float> partialCpu(static_cast<size_t>(n));
  decodeBlock(src.data(), n, in, partialCpu.data(), false);
  addToFloat(local.data(), dtype, n, partialCpu.data());
  std::vector<uint8_t> dstCpu(size_t(encodedBytes(n, outSpec)));
  encodeBlock(partialCpu.data(), kFloat32, n, outSpec, dstCpu.data(), noise);

  std::vector<uint8_t> dstEmu(dstCpu.size(), 0xcd);
  std::vector<float> partialEmu(size_t(n), -1.0f);
  std::vector<uint8_t> localCopy = local;  // the kernel may overwrite it when aliased
  float* partial = partialEmu.data();
  if (alias) partial = reinterpret_cast<float*>(localCopy.data());
  if (gpu::decodeAddEncode(src.data(), in, localCopy.data(), dtype, n, partial, outSpec,
                           dstEmu.data(), noise, nullptr) != cudaSuccess) {
    std::fprintf(stderr, "FAIL %s: launch error\n", name.c_str());
    ++failures;
    return;
  }
  if (!sameBytes(name + " partial", reinterpret_cast<const uint8_t*>(partialCpu.data()),
                 reinterpret_cast<const uint8_t*>(partial), size_t(n) * 4)) {
    return;
  }
  sameBytes(name + " bytes", dstCpu.data(), dstEmu.data(), dstCpu.size());
}

// The rotated codec (gpu::encodeRotated, decodeRotated, rotateToFloat: one warp per group, the
// Hadamard rotation in its registers) against the CPU's encodeRotatedBlock, decodeRotatedBlock
// and rotateToFloat, bit for bit: wire bytes (raw phases: H x in c.rawDtype), the decoded and
// rotated-back values of the CPU's bytes, and H float(x) (fp32 also in place). n is a multiple of
// the group size. variant 2: every element zero (constant groups after rotation, whatever the
// group size; variant 1's zeros cover groups up to 256).
void checkRotated(int32_t dtype, const CodecSpec& c, int64_t n, bool withNoise, int variant,
                  std::mt19937& gen) {
  ++cases;
  const std::string name = describe("rotated encode", dtype, c, n, 0, withNoise);
  std::vector<float> v = values(n, gen, variant == 2 ? 0 : variant);
  if (variant == 2) std::fill(v.begin(), v.end(), 0.0f);
  const std::vector<uint8_t> x = asDtype(v, dtype, 0);
  const Noise noise{noiseSalt(uint32_t(n), 3, 1), 8192, withNoise ? 1 : 0};
  const size_t bytes = size_t(encodedBytes(n, c));
  std::vector<uint8_t> cpu(bytes + 1, 0xcd), emu(bytes + 1, 0xcd);
  encodeRotatedBlock(x.data(), dtype, n, c, cpu.data(), noise);
  if (gpu::encodeRotated(x.data(), dtype, n, c, emu.data(), noise, nullptr) != cudaSuccess) {
    std::fprintf(stderr, "FAIL %s: launch error\n", name.c_str());
    ++failures;
    return;
  }
  if (!sameBytes(name, cpu.data(), emu.data(), bytes + 1)) return;

  const std::string dname = describe("rotated decode", dtype, c, n, 0, withNoise);
  std::vector<float> a(size_t(n) + 1, 7.0f), b(size_t(n) + 1, 7.0f);
  decodeRotatedBlock(cpu.data(), n, c, a.data());
  if (gpu::decodeRotated(cpu.data(), n, c, b.data(), nullptr) != cudaSuccess) {
    std::fprintf(stderr, "FAIL %s: launch error\n", dname.c_str());
    ++failures;
    return;
  }
  sameBytes(dname, reinterpret_cast<const uint8_t*>(a.data()),
            reinterpret_cast<const uint8_t*>(b.data()), (size_t(n) + 1) * 4);
}

void checkRotateToFloat(int32_t dtype, int groupSize, int64_t n, int variant, std::mt19937& gen) {
  ++cases;
  const CodecSpec shown{0, groupSize, 0, kFloat32};
  const std::string name = describe("rotate-to-float", dtype, shown, n, 0, false);
  const std::vector<float> v = values(n, gen, variant);
  const std::vector<uint8_t> x = asDtype(v, dtype, 0);
  std::vector<float> want(size_t(n) + 1, 7.0f), got(size_t(n) + 1, 7.0f);
  rotateToFloat(x.data(), dtype, n, groupSize, want.data());
  if (gpu::rotateToFloat(x.data(), dtype, n, groupSize, got.data(), nullptr) != cudaSuccess) {
    std::fprintf(stderr, "FAIL %s: launch error\n", name.c_str());
    ++failures;
    return;
  }
  if (!sameBytes(name, reinterpret_cast<const uint8_t*>(want.data()),
                 reinterpret_cast<const uint8_t*>(got.data()), (size_t(n) + 1) * 4)) {
    return;
  }
  if (dtype != kFloat32) return;
  ++cases;  // in place, as a ring hop rotates an fp32 local piece into its own sum
  std::vector<float> inPlace(v);
  if (gpu::rotateToFloat(inPlace.data(), kFloat32, n, groupSize, inPlace.data(), nullptr) !=
      cudaSuccess) {
    std::fprintf(stderr, "FAIL %s in place: launch error\n", name.c_str());
    ++failures;
    return;
  }
  sameBytes(name + " in place", reinterpret_cast<const uint8_t*>(want.data()),
            reinterpret_cast<const uint8_t*>(inPlace.data()), size_t(n) * 4);
}

// The codec launch settings (nullptr: unset), then settings::reload(), as the process-scoped
// settings are read once and kept.
void setLaunchSettings(const char* fullGrid, const char* encodeBlocks) {
  auto set = [](const char* name, const char* value) {
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  };
  set("QCOMM_CUDA_FULL_GRID", fullGrid);
  set("QCOMM_CUDA_ENCODE_BLOCKS", encodeBlocks);
  settings::reload();
}

// A launch variant: the settings it forces (nullptr: unset).
struct LaunchVariant {
  const char* name;
  const char* fullGrid;      // QCOMM_CUDA_FULL_GRID
  const char* encodeBlocks;  // QCOMM_CUDA_ENCODE_BLOCKS
};

// cuda/tuning.h's choices under the settings in force, against what they should be: the encoder
// blocks per SM (by default 4 for fp32 input but the 8-bit asymmetric codec, 3 otherwise) and
// the full grid (by default the decoder's and the 4-block encoders', from 10 Mi elements).
void checkChoices(const LaunchVariant& v) {
  using gpu::tuning::Launch;
  const std::string grid = v.fullGrid ? v.fullGrid : "auto";
  const std::string blocks = v.encodeBlocks ? v.encodeBlocks : "auto";
  auto fail = [&](const char* what, int want, int got) {
    ++failures;
    std::fprintf(stderr, "DIFFER tuning (%s) %s: want %d, got %d\n", v.name, what, want, got);
  };
  for (int32_t dtype : {kFloat32, kFloat16, kBFloat16}) {
    for (int bits : {4, 8}) {
      for (int sym : {0, 1}) {
        ++cases;
        const int measured = dtype == kFloat32 && (bits == 4 || sym) ? 4 : 3;
        const int want = blocks == "3" ? 3 : (blocks == "4" ? 4 : measured);
        const int got = gpu::tuning::encodeBlocks(dtype, bits, sym != 0);
        if (got != want) {
          const CodecSpec c{bits, 128, sym, kFloat32};
          fail(describe("blocks", dtype, c, 0, 0, false).c_str(), want, got);
        }
      }
    }
  }
  const int64_t from = int64_t(10) << 20;
  for (Launch l : {Launch::kDecode, Launch::kEncode4, Launch::kEncode3, Launch::kOther}) {
    for (int64_t n : {int64_t(1), from - 1, from, int64_t(1) << 30}) {
      ++cases;
      const bool wins = l == Launch::kDecode || l == Launch::kEncode4;
      const bool want = grid == "1" || (grid != "0" && wins && n >= from);
      const bool got = gpu::tuning::fullGrid(l, n);
      if (got != want) {
        const std::string what =
            "full grid of launch " + std::to_string(int(l)) + " n=" + std::to_string(n);
        fail(what.c_str(), int(want), int(got));
      }
    }
  }
}

}  // namespace

// Asymmetric groups that codec.h asymCodesInRange lets skip the clamp, and ones it does not.
int64_t inRangeGroups = 0, clampedGroups = 0;

// n values per codec variant: group parameters drawn as the encoder makes them (from a random
// absmax, or a random min and max; asymmetric: a quarter of the groups only 1 to 8 ulps wide,
// where the clamp can matter), scales from 2^-60 to 2^60, values on the rounding boundaries of the
// scaled code line and a few ulps either side, uniform in the group's range, and tiny. Asymmetric
// groups that pass asymCodesInRange also get quantizeInRange (no clamp) checked, on the group's
// values and on its minimum and maximum.
template <int kBits, bool kSym>
void checkReciprocal(int64_t n, std::mt19937& gen) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-58, 58), ulps(-3, 3), kind(0, 3), width(1, 8);
  const float levels = kSym ? 2.0f * qmaxSym(kBits) : levelsAsym(kBits);
  int shown = 0;
  auto compare = [&](const char* what, float v, const GroupParams& p, uint32_t want, uint32_t got) {
    ++cases;
    if (want != got) {
      ++failures;
      if (shown++ < 5) {
        std::fprintf(stderr, "DIFFER %s bits=%d sym=%d v=%a scale=%a mid=%a: %u vs %u\n", what,
                     kBits, int(kSym), v, p.scale, p.mid, want, got);
      }
    }
  };
  for (int64_t i = 0; i < n; ++i) {
    GroupParams p;
    const float span = std::ldexp(1.0f + 0.999f * std::fabs(unit(gen)), expo(gen));
    float lo = 0.0f, hi = 0.0f;
    if (kSym) {
      p = paramsFromAbsmax(span, 0, kBits);
    } else {
      lo = span * unit(gen);
      hi = lo + span;
      if (i % 4 == 3) {  // a group a few ulps wide
        hi = lo;
        for (int u = width(gen); u > 0; --u) hi = std::nextafter(hi, INFINITY);
      }
      p = paramsFromMinMax(lo, hi, 0, kBits);
    }
    if (!fastScaleRange(p.scale)) continue;
    const float rcp = 1.0f / p.scale;
    const bool inRange = !kSym && asymCodesInRange<kBits>(lo, hi, p, rcp);
    if (!kSym) {
      ++(inRange ? inRangeGroups : clampedGroups);
      if (inRange) {
        compare("in-range lo", lo, p, quantizeScaled<kBits, kSym>(lo, p),
                quantizeInRange<kBits, kSym>(lo, p, rcp));
        compare("in-range hi", hi, p, quantizeScaled<kBits, kSym>(hi, p),
                quantizeInRange<kBits, kSym>(hi, p, rcp));
      }
    }
    float v;
    switch (kind(gen)) {
      case 0: {  // a rounding boundary of the code line, nudged by a few ulps
        const float k = std::floor((unit(gen) * 0.5f + 0.5f) * levels) + 0.5f - levels * 0.5f;
        v = p.mid + k * p.scale;
        for (int u = ulps(gen); u != 0; u += u > 0 ? -1 : 1) {
          v = std::nextafter(v, u > 0 ? INFINITY : -INFINITY);
        }
        break;
      }
      case 1:
        v = p.mid + unit(gen) * p.scale * levels * 0.5f;
        break;
      case 2:
        v = p.mid + std::ldexp(unit(gen), expo(gen) - 80);
        break;
      default:
        v = std::ldexp(unit(gen), expo(gen) - 90);
    }
    // symmetric: the encoders quantize only values of the group, |v| <= its absmax (span); the
    // boundaries past qmax - 1/2 then come from v = +-span
    if (kSym && std::fabs(v) > span) v = std::copysign(span, v);
    const uint32_t want = quantizeScaled<kBits, kSym>(v, p);
    compare("quantize", v, p, want, quantizeWithReciprocal<kBits, kSym>(v, p, rcp));
    // without the clamp only for values of the group: v in [lo, hi]
    if (inRange && v >= lo && v <= hi) {
      compare("in-range", v, p, want, quantizeInRange<kBits, kSym>(v, p, rcp));
    }
  }
}

int main(int argc, char** argv) {
  at::set_num_threads(1);
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  std::mt19937 gen(11);
  const int32_t dtypes[] = {kFloat32, kFloat16, kBFloat16};
  const int groups[] = {32, 64, 128, 256, 512, 1024};

  // 1. encode and decode: the vector path (whole slabs), the partial last slab, tiny messages,
  //    and misaligned pointers (scalar path)
  int64_t before = cases;
  for (int32_t dtype : dtypes) {
    for (int bits : {4, 8}) {
      for (int sym : {1, 0}) {
        for (int g : groups) {
          const CodecSpec c{bits, g, sym, kFloat32};
          checkEncodeDecode(dtype, c, 4096, 0, false, 1, gen);  // whole slabs, special values
          checkEncodeDecode(dtype, c, 3000 + g / 2 + 3, 0, false, 0, gen);  // partial slab
          if (quick) continue;
          checkEncodeDecode(dtype, c, 1, 0, false, 0, gen);
          checkEncodeDecode(dtype, c, 37, 0, false, 0, gen);
          checkEncodeDecode(dtype, c, 2200 + 5, 1, false, 1, gen);  // misaligned: scalar path
        }
        checkEncodeDecode(dtype, CodecSpec{bits, 128, sym, kFloat32}, 5000, 0, true, 0, gen);
        checkEncodeDecode(dtype, CodecSpec{bits, 64, sym, kFloat32}, 2100, 1, true, 0, gen);
      }
    }
  }
  // raw phases (bits = 0): cast there, cast back
  for (int32_t dtype : dtypes) {
    for (int32_t raw : dtypes) {
      checkEncodeDecode(dtype, CodecSpec{0, 128, 1, raw}, 1500, 0, false, 1, gen);
    }
  }
  // messages that take several turns of the grid (the emulator's chip holds kSimtSms = 2
  // blocks of 8 warps): 41 whole slabs and a partial one, so warps take up to 3 slabs each
  for (int32_t dtype : dtypes) {
    for (int sym : {1, 0}) {
      checkEncodeDecode(dtype, CodecSpec{8, 128, sym, kFloat32}, 41 * 1024 + 77, 0, false, 1, gen);
      if (!quick) {
        checkEncodeDecode(dtype, CodecSpec{4, 32, sym, kFloat32}, 41 * 1024 + 77, 0, false, 0, gen);
      }
    }
  }
  std::printf("encode/decode: %lld cases, %d differences\n", (long long)(cases - before), failures);

  // the rotated codec: every bit width (raw phases in each raw dtype), symmetry, input dtype and
  // stochastic rounding, groups of 32, 128 and 1024 (one register per lane, four, 32: stages all
  // across lanes, mixed, all in registers), special values, zeros, and several turns of the grid
  before = cases;
  const int failuresBeforeRotated = failures;
  for (int32_t dtype : dtypes) {
    for (int g : {32, 128, 1024}) {
      for (int bits : {4, 8}) {
        for (int sym : {1, 0}) {
          for (int nz = 0; nz < 2; ++nz) {
            const CodecSpec c{bits, g, sym, kFloat32};
            checkRotated(dtype, c, 4096, nz != 0, 1, gen);
            if (quick) continue;
            checkRotated(dtype, c, 3 * int64_t(g), nz != 0, 0, gen);
            checkRotated(dtype, c, 2048, nz != 0, 2, gen);
          }
        }
      }
      for (int32_t raw : dtypes) {
        checkRotated(dtype, CodecSpec{0, g, 1, raw}, 4096, false, 1, gen);
        if (!quick) checkRotated(dtype, CodecSpec{0, g, 1, raw}, 3 * int64_t(g), false, 0, gen);
      }
      checkRotateToFloat(dtype, g, 4096, 1, gen);
      if (!quick) checkRotateToFloat(dtype, g, 5 * int64_t(g), 0, gen);
    }
    // 41 groups of 1024 and 164 of 256: warps take several groups each (the emulator's chip
    // holds 2 blocks of 8 warps)
    checkRotated(dtype, CodecSpec{8, 1024, 0, kFloat32}, 41 * 1024, false, 1, gen);
    if (!quick) checkRotated(dtype, CodecSpec{4, 256, 1, kFloat32}, 41 * 1024, true, 1, gen);
  }
  // what the rotated kernels refuse: a partial group, a group size outside 32..1024 or not a power
  // of two (std::invalid_argument, as the CPU's partial groups; nothing written)
  int rotatedRefusals = 0;
  {
    std::vector<float> x(4096, 1.0f), out(4096, 0.0f);
    std::vector<uint8_t> dst(size_t(encodedBytes(4096, CodecSpec{8, 16, 1, kFloat32})), 0);
    auto refusedRotation = [&](const char* what, auto call) {
      ++cases;
      try {
        call();
      } catch (const std::invalid_argument& e) {
        if (std::string(e.what()).find("whole groups") != std::string::npos) {
          ++rotatedRefusals;
          return;
        }
      }
      ++failures;
      std::fprintf(stderr, "FAIL rotated %s: not refused\n", what);
    };
    const Noise none{0, 0, 0};
    refusedRotation("encode of a partial group", [&] {
      (void)gpu::encodeRotated(x.data(), kFloat32, 4000, CodecSpec{8, 128, 1, kFloat32}, dst.data(),
                               none, nullptr);
    });
    refusedRotation("encode with groups of 16", [&] {
      (void)gpu::encodeRotated(x.data(), kFloat32, 4096, CodecSpec{8, 16, 1, kFloat32}, dst.data(),
                               none, nullptr);
    });
    refusedRotation("encode with groups of 2048", [&] {
      (void)gpu::encodeRotated(x.data(), kFloat32, 4096, CodecSpec{8, 2048, 1, kFloat32},
                               dst.data(), none, nullptr);
    });
    refusedRotation("decode of a partial group", [&] {
      (void)gpu::decodeRotated(dst.data(), 4000, CodecSpec{4, 128, 0, kFloat32}, out.data(),
                               nullptr);
    });
    refusedRotation("rotation with groups of 96", [&] {
      (void)gpu::rotateToFloat(x.data(), kFloat32, 96 * 8, 96, out.data(), nullptr);
    });
  }
  std::printf("rotated codec: %lld cases, %d differences, %d of 5 bad shapes refused\n",
              (long long)(cases - before), failures - failuresBeforeRotated, rotatedRefusals);

  // the same multi-turn messages in the launch variants that the settings force:
  // QCOMM_CUDA_ENCODE_BLOCKS=4 and 3 (every encoder compiled for 4 or 3 blocks per SM; by default
  // fp32 takes 4 but for the 8-bit asymmetric codec), QCOMM_CUDA_FULL_GRID=1 (every block the
  // work needs, one turn each), alone and with 4 encoder blocks, QCOMM_CUDA_FULL_GRID=0 with
  // QCOMM_CUDA_ENCODE_BLOCKS=3 (the resident grid and the 3-block encoders for every codec, the
  // default before 2026-11-30), and both written "auto" (the default; any case): the same bytes,
  // and tuning.h's choices as the settings say (the default's too)
  const LaunchVariant variants[] = {
      {"4 encode blocks", nullptr, "4"},
      {"3 encode blocks", nullptr, "3"},
      {"full grid", "1", nullptr},
      {"full grid with 4 encode blocks", "1", "4"},
      {"resident grid with 3 encode blocks", "0", "3"},
      {"auto", "auto", "AUTO"},
  };
  before = cases;
  const int failuresBeforeVariants = failures;
  setLaunchSettings(nullptr, nullptr);  // the default, whatever the caller's environment holds
  checkChoices(LaunchVariant{"default", nullptr, nullptr});
  for (const LaunchVariant& v : variants) {
    setLaunchSettings(v.fullGrid, v.encodeBlocks);
    checkChoices(v);
    for (int32_t dtype : dtypes) {
      for (int sym : {1, 0}) {
        checkEncodeDecode(dtype, CodecSpec{8, 128, sym, kFloat32}, 41 * 1024 + 77, 0, false, 1,
                          gen);
        checkEncodeDecode(dtype, CodecSpec{4, 32, sym, kFloat32}, 41 * 1024, 0, false, 0, gen);
      }
    }
    checkHop(kFloat32, CodecSpec{8, 128, 1, kFloat32}, CodecSpec{4, 128, 0, kFloat32}, 41 * 1024,
             false, false, gen);
    checkDecodeSum(CodecSpec{4, 128, 0, kFloat32}, 3, 41 * 1024 + 77, false, gen);
  }
  setLaunchSettings(nullptr, nullptr);
  std::string names;
  for (const LaunchVariant& v : variants) names += std::string(names.empty() ? "" : ", ") + v.name;
  std::printf("launch variants (%s): %lld cases, %d differences\n", names.c_str(),
              (long long)(cases - before), failures - failuresBeforeVariants);

  // a value a setting does not allow: the launch that reads it throws std::invalid_argument,
  // naming the variable, the value and what is allowed, and launches nothing; once the value is
  // gone (and the settings reloaded), the next launch runs
  before = cases;
  const int failuresBeforeRefusals = failures;
  int refusals = 0;
  std::string shown;
  auto refused = [&](const char* name, const char* value, const char* what, auto call) {
    ++cases;
    setenv(name, value, 1);
    settings::reload();
    std::string message;
    try {
      call();
    } catch (const std::invalid_argument& e) {
      message = e.what();
    }
    unsetenv(name);
    settings::reload();
    const std::string quoted = std::string(name) + "='" + value + "'";
    if (message.find(quoted) != std::string::npos && message.find("allowed") != std::string::npos) {
      ++refusals;
      if (shown.empty()) shown = message;
    } else {
      ++failures;
      std::fprintf(stderr, "FAIL %s with %s: %s\n", what, quoted.c_str(),
                   message.empty() ? "no std::invalid_argument" : message.c_str());
    }
  };
  {
    const int64_t n = 4096;
    std::vector<float> x(size_t(n), 1.5f), out(size_t(n), 0.0f);
    const CodecSpec q{8, 128, 0, kFloat32};
    std::vector<uint8_t> enc(size_t(encodedBytes(n, q)), 0);
    encodeBlock(x.data(), kFloat32, n, q, enc.data(), Noise{0, 0, 0});
    std::vector<uint8_t> dst(enc.size(), 0xcd);
    const std::vector<uint8_t> untouched = dst;
    const Noise none{0, 0, 0};
    refused("QCOMM_CUDA_FULL_GRID", "2", "encode",
            [&] { (void)gpu::encode(x.data(), kFloat32, n, q, dst.data(), none, nullptr); });
    refused("QCOMM_CUDA_ENCODE_BLOCKS", "5", "encode",
            [&] { (void)gpu::encode(x.data(), kFloat32, n, q, dst.data(), none, nullptr); });
    refused("QCOMM_CUDA_FULL_GRID", "on", "raw encode", [&] {
      (void)gpu::encode(x.data(), kFloat32, n, CodecSpec{0, 128, 1, kBFloat16}, dst.data(), none,
                        nullptr);
    });
    if (dst != untouched) {
      ++failures;
      std::fprintf(stderr, "FAIL: a refused encode wrote its output\n");
    }
    refused("QCOMM_CUDA_FULL_GRID", "yes", "decode",
            [&] { (void)gpu::decode(enc.data(), n, q, out.data(), false, nullptr); });
    const uint8_t* srcs[] = {enc.data(), enc.data()};
    refused("QCOMM_CUDA_FULL_GRID", "-1", "decode-sum",
            [&] { (void)gpu::decodeSum(srcs, 2, n, q, out.data(), false, nullptr); });
    refused("QCOMM_CUDA_FULL_GRID", "full", "divide",
            [&] { (void)gpu::divide(out.data(), n, 2.0f, nullptr); });
  }
  const int64_t tried = cases - before;
  // and the default again: the same bytes
  checkEncodeDecode(kFloat32, CodecSpec{8, 128, 1, kFloat32}, 41 * 1024, 0, false, 0, gen);
  std::printf(
      "refused settings: %d of %lld launches threw std::invalid_argument (%s), %d "
      "differences\n",
      refusals, (long long)tried, shown.c_str(), failures - failuresBeforeRefusals);

  // the codec kernels' grids: never more than resident, every block the same number of turns
  for (int64_t cap = 1; cap <= 40; ++cap) {
    for (int64_t needed = 0; needed <= 200; ++needed) {
      const int64_t g = qcomm::gpu::balancedGrid(needed, cap);
      const int64_t want = needed < 1 ? 1 : (needed + cap - 1) / cap;  // turns of the whole chip
      const bool ok = g >= 1 && g <= cap &&
                      (needed < 1 || (g <= needed && (needed + g - 1) / g == want &&
                                      (g == 1 || (needed + g - 2) / (g - 1) > want)));
      if (!ok) {
        ++failures;
        std::fprintf(stderr, "DIFFER balancedGrid(%lld, %lld) = %lld\n", (long long)needed,
                     (long long)cap, (long long)g);
      }
    }
  }

  // the sum of W encoded copies (two_step's owners): 1 to 8 blocks in one launch, 11 in two (the
  // second adding to the first's sum), every bit width and symmetry, several group sizes and
  // sizes, special values in every third block, misaligned output and data, raw blocks; and added
  // to the owner's own values already in the output (accumulate)
  before = cases;
  const int failuresBeforeSum = failures;
  for (int bits : {4, 8}) {
    for (int sym : {1, 0}) {
      for (int count : {1, 2, 3, 8, 11}) {
        checkDecodeSum(CodecSpec{bits, 128, sym, kFloat32}, count, 4096 + 100, false, gen);
        checkDecodeSum(CodecSpec{bits, 128, sym, kFloat32}, count, 4096 + 100, false, gen, true);
        if (quick) continue;
        checkDecodeSum(CodecSpec{bits, 64, sym, kFloat32}, count, 3000 + 3, true, gen, true);
        checkDecodeSum(CodecSpec{bits, 32, sym, kFloat32}, count, 41 * 1024 + 77, false, gen);
        checkDecodeSum(CodecSpec{bits, 1024, sym, kFloat32}, count, 7, false, gen);
        checkDecodeSum(CodecSpec{bits, 64, sym, kFloat32}, count, 3000 + 3, true, gen);
      }
    }
  }
  for (int32_t raw : dtypes) {
    checkDecodeSum(CodecSpec{0, 128, 1, raw}, 3, 1500, false, gen);
    checkDecodeSum(CodecSpec{0, 128, 1, raw}, 3, 1500, false, gen, true);
  }
  std::printf("decode-sum: %lld cases, %d differences\n", (long long)(cases - before),
              failures - failuresBeforeSum);

  // AVG's division (gpu::divide) against the CPU's divideBy: special values in every variant 1
  before = cases;
  const int failuresBeforeDivide = failures;
  for (int world : {2, 3, 5, 7, 8}) {
    for (int64_t n : {int64_t(1), int64_t(4096 + 77)}) {
      ++cases;
      const std::vector<float> v = values(n, gen, world % 2);
      std::vector<float> want = v, got = v;
      divideBy(want.data(), n, float(world));
      if (gpu::divide(got.data(), n, float(world), nullptr) != cudaSuccess) {
        std::fprintf(stderr, "FAIL divide: launch error\n");
        ++failures;
        continue;
      }
      sameBytes("divide world=" + std::to_string(world) + " n=" + std::to_string(n),
                reinterpret_cast<const uint8_t*>(want.data()),
                reinterpret_cast<const uint8_t*>(got.data()), size_t(n) * 4);
    }
  }
  std::printf("divide: %lld cases, %d differences\n", (long long)(cases - before),
              failures - failuresBeforeDivide);

  // 2. the fused ring hop, each input codec into each output codec, fp32 partial aliasing the
  //    local input as the ring does in place (and the unfused sequence of the raw phases, aliased
  //    too)
  before = cases;
  const int failuresBefore = failures;
  for (int32_t dtype : dtypes) {
    for (int inBits : {4, 8}) {
      for (int outBits : {4, 8}) {
        for (int sym : {1, 0}) {
          const int g = quick ? 128 : (inBits == 4 ? 32 : 256);
          const CodecSpec in{inBits, g, sym, kFloat32};
          const CodecSpec out{outBits, g, 1 - sym, kFloat32};
          checkHop(dtype, in, out, 4096 + 100, false, false, gen);
          if (dtype == kFloat32) checkHop(dtype, in, out, 3072, true, false, gen);
        }
      }
    }
    checkHop(dtype, CodecSpec{8, 128, 1, kFloat32}, CodecSpec{4, 128, 0, kFloat32}, 2048, false,
             true, gen);
    // group sizes that differ, and raw phases: the unfused sequence
    checkHop(dtype, CodecSpec{8, 64, 1, kFloat32}, CodecSpec{8, 128, 1, kFloat32}, 1000, false,
             false, gen);
    checkHop(dtype, CodecSpec{0, 128, 1, kBFloat16}, CodecSpec{8, 128, 0, kFloat32}, 1000, false,
             false, gen);
  }
  // raw phases with the fp32 partial aliasing the local input, as the rings' hops run with
  // rs_bits=None on an fp32 message (sums kept in place) or on any rotated plan (the rotation
  // written into the partial): the decode must add to the local values, not overwrite them
  for (int32_t raw : {kFloat32, kBFloat16, kFloat16}) {
    checkHop(kFloat32, CodecSpec{0, 128, 1, raw}, CodecSpec{0, 128, 1, raw}, 1000, true, false,
             gen);
  }
  checkHop(kFloat32, CodecSpec{0, 128, 1, kFloat32}, CodecSpec{8, 128, 0, kFloat32}, 1000, true,
           false, gen);
  checkHop(kFloat32, CodecSpec{8, 128, 1, kFloat32}, CodecSpec{0, 128, 1, kFloat32}, 1000, true,
           false, gen);
  std::printf("ring hop: %lld cases, %d differences\n", (long long)(cases - before),
              failures - failuresBefore);
  // 3. the GPU encoders' division-free quantizer (codec.h quantizeWithReciprocal) against
  //    quantizeScaled, value by value: scales over the whole fast range, values at and a few ulps
  //    around every rounding boundary, uniform values, and tiny ones
  before = cases;
  const int failuresBefore3 = failures;
  const int64_t perCodec = quick ? 200000 : 2000000;
  checkReciprocal<8, true>(perCodec, gen);
  checkReciprocal<8, false>(perCodec, gen);
  checkReciprocal<4, true>(perCodec, gen);
  checkReciprocal<4, false>(perCodec, gen);
  std::printf("quantize with reciprocal: %lld values, %d differences\n",
              (long long)(cases - before), failures - failuresBefore3);
  // the unclamped path must have been taken, and refused, for the check to mean anything
  std::printf("asymmetric groups without the clamp: %lld, with it: %lld\n",
              (long long)inRangeGroups, (long long)clampedGroups);
  if (inRangeGroups == 0 || clampedGroups == 0) {
    std::fprintf(stderr, "FAIL: asymCodesInRange took only one side\n");
    ++failures;
  }
  if (failures == 0)
    std::printf("all %lld cases bit-identical to the CPU codec\n", (long long)cases);
  return failures == 0 ? 0 : 1;
}
