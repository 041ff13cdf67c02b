// CpuCodecOps: CodecOps over the CPU loops of codec_cpu.h.
#include "codec/codec_ops.h"

#include <stdexcept>
#include <vector>

#include "codec/codec_cpu.h"

namespace qcomm {

void CpuCodecOps::encode(const void* x, int32_t dtype, int64_t n, const CodecSpec& spec,
                         uint8_t* dst, const Noise& noise) {
  encodeBlock(x, dtype, n, spec, dst, noise);
}

void CpuCodecOps::decode(const uint8_t* src, int64_t n, const CodecSpec& spec, float* out,
                         bool accumulate) {
  decodeBlock(src, n, spec, out, accumulate);
}

void CpuCodecOps::decodeResult(const uint8_t* src, int64_t n, const CodecSpec& spec, float* out) {
  if (n * int64_t(sizeof(float)) >= kStreamedDecodeBytes) {
    decodeBlockStreamed(src, n, spec, out);
  } else {
    decodeBlock(src, n, spec, out, false);
  }
}

void CpuCodecOps::decodeSum(const std::function<const uint8_t*(int)>& src, int count, int64_t n,
                            const CodecSpec& spec, float* out, bool accumulate) {
  std::vector<const uint8_t*> blocks(static_cast<size_t>(count));
  for (int k = 0; k < count; ++k) blocks[size_t(k)] = src(k);
  decodeSumBlock(blocks.data(), count, n, spec, out, accumulate);
}

void CpuCodecOps::decodeAddEncode(const uint8_t* src, const CodecSpec& in, const void* local,
                                  int32_t localDtype, int64_t n, float* partial,
                                  const CodecSpec& out, uint8_t* dst, const Noise& noise) {
  decodeAddEncodeBlock(src, in, local, localDtype, n, partial, out, dst, noise);
}

void CpuCodecOps::addToFloat(const void* x, int32_t dtype, int64_t n, float* acc) {
  qcomm::addToFloat(x, dtype, n, acc);
}

void CpuCodecOps::castToFloat(const void* x, int32_t dtype, int64_t n, float* out) {
  qcomm::castToFloat(x, dtype, n, out);
}

void CpuCodecOps::castFromFloat(const float* x, int64_t n, int32_t dtype, void* out) {
  qcomm::castFromFloat(x, n, dtype, out);
}

void CpuCodecOps::divide(float* x, int64_t n, int world) { divideBy(x, n, float(world)); }

void CpuCodecOps::multiply(float* x, int64_t n, float factor) { multiplyBy(x, n, factor); }

void CpuCodecOps::encodeRotated(const void* x, int32_t dtype, int64_t n, const CodecSpec& spec,
                                uint8_t* dst, const Noise& noise) {
  encodeRotatedBlock(x, dtype, n, spec, dst, noise);
}

void CpuCodecOps::decodeRotated(const uint8_t* src, int64_t n, const CodecSpec& spec, float* out) {
  decodeRotatedBlock(src, n, spec, out);
}

void CpuCodecOps::rotateToFloat(const void* x, int32_t dtype, int64_t n, int groupSize,
                                float* out) {
  qcomm::rotateToFloat(x, dtype, n, groupSize, out);
}

namespace {
[[noreturn]] void noRotation() {
  throw std::runtime_error("the rotated codec (rotate=True) is not available on this device");
}
}  // namespace

void CodecOps::encodeRotated(const void*, int32_t, int64_t, const CodecSpec&, uint8_t*,
                             const Noise&) {
  noRotation();
}
void CodecOps::decodeRotated(const uint8_t*, int64_t, const CodecSpec&, float*) { noRotation(); }
void CodecOps::rotateToFloat(const void*, int32_t, int64_t, int, float*) { noRotation(); }

void CodecOps::multiply(float*, int64_t, float) {
  throw std::runtime_error("multiply (PREMUL_SUM's factor) is not available on this device");
}

}  // namespace qcomm
