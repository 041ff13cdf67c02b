// two_step, ring and semi_ring over the inner backend's own collectives, on CPU or CUDA tensors:
// the same orchestration moves CPU bytes through Gloo and CUDA bytes through NCCL (any set of
// GPUs, multi-node included); only the CodecOps differ. Results are bit-identical to the CPU
// algorithms (algorithms.h) and to qcomm/reference.py for the same Plan.
//
// On CUDA every step is enqueued on the current stream and nothing blocks the host: the inner
// NCCL Work's wait() makes the current stream wait on NCCL's, so each transfer is waited on
// before the kernels that consume its bytes, and scratch buffers come from the stream-ordered
// caching allocator (NCCL records the streams of the tensors it moves).
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "codec/codec_ops.h"
#include "plan/plan.h"
#include "transport/c10d_transport.h"

namespace qcomm {

class QncclBackend;

// Runs plan.algorithm (kTwoStep, kRing or kSemiRing) in place on the contiguous tensor `data`
// (plan.numel elements of plan.dtype, on the device `ops` serves), moving uint8 tensors with
// `inner`'s collectives: two_step with one alltoall_base and one _allgather_base, the rings with
// one isend/irecv batch per hop and the same _allgather_base gather phase. Rotation is refused.
// timeout bounds each host-side wait (CPU); on CUDA the inner backend's watchdog applies its own.
void runCollective(const Plan& plan, c10d::Backend& inner, int rank, at::Tensor& data,
                   CodecOps& ops, std::chrono::milliseconds timeout);

// two_step as runCollective runs it, with its all-to-all and all-gather done by `ex` (the CUDA-IPC
// buffers' copies: QCOMM_IPC_KERNELS=separate, ipc_exchange.h).
void runTwoStepOver(const Plan& plan, ByteExchange& ex, int rank, at::Tensor& data, CodecOps& ops);

// Test hook: an allreduce of `t` (SUM, or AVG) through runCollective, planned as
// QncclBackend::allreduce plans it, over be.inner(t.is_cuda()) with the CodecOps of t's device
// (CUDA: the current stream); the result lands in t, which is returned. callSeq < 0 takes the
// backend's next sequence number without advancing it, so a following dist.all_reduce rounds
// with the same noise. forceWorld1 plans a world-size-1 group as if it were quantized (one
// chunk), the only case a single GPU can run over NCCL; not part of any user-facing path.
at::Tensor collectiveAllreduceForTest(QncclBackend& be, at::Tensor t, bool avg,
                                      bool forceWorld1 = false, int64_t callSeq = -1,
                                      std::chrono::milliseconds timeout = std::chrono::minutes(5));

}  // namespace qcomm
