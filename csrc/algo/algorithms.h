// The three quantized allreduce schedules on host memory, as sequences of codec calls and
// transfers. Each works in place on `data` (numel elements of plan.dtype, contiguous).
#pragma once

#include <vector>

#include "codec/codec.h"
#include "plan/plan.h"
#include "transport/c10d_transport.h"

namespace qcomm {

void runTwoStep(const Plan& plan, Transport& t, void* data);
void runRing(const Plan& plan, Transport& t, void* data);
void runSemiRing(const Plan& plan, Transport& t, void* data);

// Decode gather-phase bytes of `range` into data (in plan.dtype; fp16/bf16 through `scratch`).
void decodeToOutput(const Plan& plan, const uint8_t* bytes, ChunkRange range, void* data,
                    std::vector<float>& scratch);

// For AVG: sum[i] / world, in fp32 (a no-op for SUM).
void divideByWorld(const Plan& plan, float* sum, int64_t len);

// a mod w in [0, w), for rank arithmetic that may go negative.
inline int wrapRank(int a, int w) { return ((a % w) + w) % w; }

// semi_ring's schedule (algo_semi_ring.cpp): the chunk `rank` sends, and the chunk it receives,
// at its own step s of direction d (0: the right chain, R = world / 2 steps; 1: the left chain,
// L = (world - 1) / 2 steps).
inline int semiRingSendChunk(int rank, int world, int d, int s) {
  return d == 0 ? wrapRank(rank - world / 2 + s, world)
                : wrapRank(rank + (world - 1) / 2 - s, world);
}
inline int semiRingRecvChunk(int rank, int world, int d, int s) {
  return semiRingSendChunk(wrapRank(rank + (d == 0 ? 1 : -1), world), world, d, s);
}

// Pointer to element `offset` of a buffer of plan.dtype.
inline void* elemPtr(void* data, int32_t dtype, int64_t offset) {
  return static_cast<uint8_t*>(data) + offset * dtypeBytes(dtype);
}

// A byte buffer for the transport.
at::Tensor byteBuffer(int64_t bytes);

}  // namespace qcomm
