// The quantized allreduce, in place: two_step (two_step.cpp), ring (ring.cpp) and semi_ring
// (semi_ring.cpp), each written once as a schedule of codec operations (CodecOps) and exchanges
// (Transport), for CPU and CUDA tensors alike. The transport decides how a schedule runs: cut into
// the plan's microshards with every receive posted first where transfers overlap the codec (Gloo
// on host memory), or one collective per step where they are stream-ordered (NCCL, CUDA IPC).
// Shards are whole groups and each element's noise depends on its index in the message alone,
// so the result is the same bits either way (and those of qcomm/reference.py for the plan).
#pragma once

#include <ATen/ATen.h>

#include "algo/scratch.h"
#include "codec/codec_ops.h"
#include "plan/plan.h"
#include "transport/transport.h"

namespace qcomm {

// Runs plan.algorithm (kTwoStep, kRing or kSemiRing) in place on `data`: contiguous, plan.numel
// elements of plan.dtype, on the device `ops` serves. Buffers are allocated before the first
// exchange begins, and nothing after; from `scratch` when given (kept for the next call; the
// caller calls its begin() first), else for this call. An error names the rank and the step that
// failed. A rotated plan's data holds the caller's values, padded by the caller with zeros to
// whole groups (plan.numel); the codec rotates each group on its way in and out.
void runAllreduce(const Plan& plan, Transport& t, CodecOps& ops, at::Tensor& data,
                  Scratch* scratch = nullptr);

// A quantized reduce-scatter (plan.collective kReduceScatter): the reduce half of plan.algorithm
// over `input` (contiguous, plan.numel = W x chunkElems elements), this rank's summed chunk scaled
// (AVG, PREMUL_SUM), rotated back (a rotated plan) and cast into `output` (contiguous,
// plan.userRowElems() elements of the same dtype: the chunk without a rotated row's padding).
// `input` is never written; `output` may be this rank's chunk of it (in place, unpadded plans).
void runReduceScatter(const Plan& plan, Transport& t, CodecOps& ops, at::Tensor& input,
                      at::Tensor& output, Scratch* scratch = nullptr);

// A quantized all-gather (plan.collective kAllGather): `data` (contiguous, plan.numel elements)
// holds this rank's input in its slot (chunk rank); on return every slot holds the decoded gather
// codec of its owner's input, this rank's own slot too (the same bits on every rank).
void runAllGather(const Plan& plan, Transport& t, CodecOps& ops, at::Tensor& data,
                  Scratch* scratch = nullptr);

// Whether the plan runs on a copy of the caller's message padded to whole groups (a rotated
// message whose rows end inside a group).
inline bool needsPadding(const Plan& plan) { return plan.numel != plan.userNumel; }
// That copy: t's plan.userNumel elements (any layout) as plan.rows rows, each followed by zeros
// up to plan.numel / rows elements (the allreduce: one row; a sharded call: one row per shard,
// so that shard c's groups start at its own start); in `storage` (plan.numel elements of t's
// dtype, on t's device) when given, else newly allocated. On t's current stream for a CUDA tensor.
// A reduce-scatter pads its input; its output is written unpadded (runReduceScatter).
at::Tensor paddedCopy(const Plan& plan, const at::Tensor& t, at::Tensor storage = {});
// Copies the caller's elements of such a copy (each row's first userRowElems()) back into t.
void copyUnpadded(const Plan& plan, const at::Tensor& padded, at::Tensor& t);

}  // namespace qcomm
