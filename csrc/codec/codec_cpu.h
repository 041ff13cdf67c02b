// CPU loops over the shared codec (codec.h): encode and decode whole blocks, threaded over groups.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codec/codec.h"

namespace qcomm {

// Encode x[0..n) (elements of `dtype`) into dst, which holds encodedBytes(n, c) bytes. With
// c.bits == 0 the elements are stored raw in c.rawDtype (converted, rounding to nearest even).
// With noise.on, codes are rounded stochastically (codec.h quantizeStochastic).
void encodeBlock(const void* x, int32_t dtype, int64_t n, const CodecSpec& c, uint8_t* dst,
                 const Noise& noise = Noise{0, 0, 0});

// Decode an encoded block of n elements into fp32: out = x^ (or out += x^ with accumulate).
void decodeBlock(const uint8_t* src, int64_t n, const CodecSpec& c, float* out, bool accumulate);

// decodeBlock's overwrite (out = x^) with non-temporal stores, for a large output that nothing
// reads soon: its lines are written without first being read into the cache. Where the format has
// a fixed-size loop, out is 32-byte aligned and the loops are AVX2 or AVX-512; else as decodeBlock.
// The same values either way.
void decodeBlockStreamed(const uint8_t* src, int64_t n, const CodecSpec& c, float* out);

// CpuCodecOps::decodeResult streams outputs of at least this many bytes (8 MiB: from there an
// output last touched long before decoded 1.2x-1.3x faster streamed with AVX2 and AVX-512, one
// just written 0.96x-1.11x; below, down to 0.57x; results/02-cpu-codec.md, "Streamed decodes").
constexpr int64_t kStreamedDecodeBytes = int64_t(8) << 20;

// out = decode(srcs[0]) + decode(srcs[1]) + ... + decode(srcs[count - 1]) (blocks of n elements),
// summed in fp32 in that order (out = out + decode(srcs[0]) + ... with accumulate): the bits of
// a decode and count - 1 decodes with accumulate (count decodes with accumulate), in one pass over
// out.
void decodeSumBlock(const uint8_t* const* srcs, int count, int64_t n, const CodecSpec& c,
                    float* out, bool accumulate = false);

// One ring hop (CodecOps::decodeAddEncode): partial = decode(src) + float(local), then dst =
// encode(partial), the same bits as the three calls, done piece by piece so that each piece of
// partial is encoded while it is still in cache. partial may be local (fp32).
void decodeAddEncodeBlock(const uint8_t* src, const CodecSpec& in, const void* local,
                          int32_t localDtype, int64_t n, float* partial, const CodecSpec& out,
                          uint8_t* dst, const Noise& noise);

// acc[i] += float(x[i]) for x of `dtype`.
void addToFloat(const void* x, int32_t dtype, int64_t n, float* acc);

// out[i] = dtype(x[i]), rounding to nearest even.
void castFromFloat(const float* x, int64_t n, int32_t dtype, void* out);

// x[i] = x[i] / divisor, in fp32 (AVG divides the sum by the world size).
void divideBy(float* x, int64_t n, float divisor);
// x[i] = x[i] * factor, in fp32 (PREMUL_SUM's factor, applied to the sum).
void multiplyBy(float* x, int64_t n, float factor);

// Rotation (codec.h hadamardGroup), fused into the codec: n a multiple of the group size (else
// std::invalid_argument). encodeRotatedBlock: encodeBlock of H x (each group rotated on its way
// into the quantizer); decodeRotatedBlock: out = H x^ / g (each group rotated back on its way
// out); rotateToFloat: out = H float(x) per group of `groupSize` (out may be x, for fp32 x).
void encodeRotatedBlock(const void* x, int32_t dtype, int64_t n, const CodecSpec& c, uint8_t* dst,
                        const Noise& noise = Noise{0, 0, 0});
void decodeRotatedBlock(const uint8_t* src, int64_t n, const CodecSpec& c, float* out);
void rotateToFloat(const void* x, int32_t dtype, int64_t n, int groupSize, float* out);

// out[i] = float(x[i]) for x of `dtype`.
void castToFloat(const void* x, int32_t dtype, int64_t n, float* out);

// The encode and decode loops are compiled for several instruction sets ("generic", the baseline
// x86-64; "avx2"; "avx512"), the same bits from each. cpuIsas: those this CPU has; cpuIsa: the one
// in use (at the first codec call, QCOMM_CPU_ISA, unset or "auto" for the widest this CPU has);
// setCpuIsa: use `name` ("auto" or one of cpuIsas) from now on, returning the one used before.
// An unknown or unavailable name throws std::invalid_argument.
std::vector<std::string> cpuIsas();
std::string cpuIsa();
std::string setCpuIsa(const std::string& name);

}  // namespace qcomm
