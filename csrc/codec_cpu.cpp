// CPU loops over the shared codec: each loop walks whole groups, threaded with at::parallel_for.
#include "codec_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

namespace qcomm {
namespace {

// Groups per parallel task: 256 groups of 128 elements is 32K elements, enough work to amortise a
// task hand-off and small enough that a 1 MiB message still uses two cores.
constexpr int64_t kGroupsPerTask = 256;
constexpr int64_t kElemsPerTask = 1 << 15;

template <class F>
void forGroups(int64_t groups, F&& f) {
  at::parallel_for(0, groups, kGroupsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) f(g);
  });
}

template <class F>
void forElems(int64_t n, F&& f) {
  at::parallel_for(0, n, kElemsPerTask, [&](int64_t begin, int64_t end) { f(begin, end); });
}

template <class T>
void encodeTyped(const T* x, int64_t n, const CodecSpec& c, uint8_t* dst, const Noise& noise) {
  if (c.bits == 0) {
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
  // The padding between metadata and data is zeroed so the wire bytes are fully determined.
  const int64_t meta = metaBytes(n, c);
  std::memset(dst + meta, 0, size_t(dataOffset(n, c) - meta));
  forGroups(numGroups(n, c), [&](int64_t g) { encodeGroup(x, n, c, g, dst, noise); });
}

template <class T>
void castTo(const T* x, int64_t n, float* out, bool accumulate) {
  forElems(n, [&](int64_t b, int64_t e) {
    if (accumulate) {
      for (int64_t i = b; i < e; ++i) out[i] = out[i] + toFloat(x[i]);
    } else {
      for (int64_t i = b; i < e; ++i) out[i] = toFloat(x[i]);
    }
  });
}

void toFloatDispatch(const void* x, int32_t dtype, int64_t n, float* out, bool accumulate) {
  switch (dtype) {
    case kFloat32:
      castTo(static_cast<const float*>(x), n, out, accumulate);
      break;
    case kFloat16:
      castTo(static_cast<const fp16_t*>(x), n, out, accumulate);
      break;
    default:
      castTo(static_cast<const bf16_t*>(x), n, out, accumulate);
  }
}

}  // namespace

void encodeBlock(const void* x, int32_t dtype, int64_t n, const CodecSpec& c, uint8_t* dst,
                 const Noise& noise) {
  if (n == 0) return;
  switch (dtype) {
    case kFloat32:
      encodeTyped(static_cast<const float*>(x), n, c, dst, noise);
      break;
    case kFloat16:
      encodeTyped(static_cast<const fp16_t*>(x), n, c, dst, noise);
      break;
    default:
      encodeTyped(static_cast<const bf16_t*>(x), n, c, dst, noise);
  }
}

void decodeBlock(const uint8_t* src, int64_t n, const CodecSpec& c, float* out, bool accumulate) {
  if (n == 0) return;
  if (c.bits == 0) {
    toFloatDispatch(src, c.rawDtype, n, out, accumulate);
    return;
  }
  if (accumulate) {
    forGroups(numGroups(n, c), [&](int64_t g) { decodeGroup<true>(src, n, c, g, out); });
  } else {
    forGroups(numGroups(n, c), [&](int64_t g) { decodeGroup<false>(src, n, c, g, out); });
  }
}

void addToFloat(const void* x, int32_t dtype, int64_t n, float* acc) {
  toFloatDispatch(x, dtype, n, acc, true);
}

void castToFloat(const void* x, int32_t dtype, int64_t n, float* out) {
  toFloatDispatch(x, dtype, n, out, false);
}

void rotateForward(const void* x, int32_t dtype, int64_t n, int groupSize, float* out) {
  const int64_t groups = (n + groupSize - 1) / groupSize;
  forGroups(groups, [&](int64_t g) {
    const int64_t begin = g * groupSize;
    const int64_t len = std::min<int64_t>(groupSize, n - begin);
    castToFloat(static_cast<const uint8_t*>(x) + begin * dtypeBytes(dtype), dtype, len,
                out + begin);
    for (int64_t i = len; i < groupSize; ++i) out[begin + i] = 0.0f;
    hadamardGroup(out + begin, groupSize);
  });
}

void rotateInverse(float* y, int64_t paddedN, int groupSize) {
  const float inv = 1.0f / float(groupSize);  // a power of two: exact
  forGroups(paddedN / groupSize, [&](int64_t g) {
    float* v = y + g * groupSize;
    hadamardGroup(v, groupSize);
    for (int i = 0; i < groupSize; ++i) v[i] = v[i] * inv;
  });
}

void divideBy(float* x, int64_t n, float divisor) {
  forElems(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] = x[i] / divisor;
  });
}

void castFromFloat(const float* x, int64_t n, int32_t dtype, void* out) {
  CodecSpec raw{0, 32, 1, dtype};
  encodeTyped(x, n, raw, static_cast<uint8_t*>(out), Noise{0, 0, 0});
}

}  // namespace qcomm
