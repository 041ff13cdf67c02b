// One call of the fused two_step experiment over the CUDA-IPC transport (fused.h).
#ifdef QCOMM_WITH_CUDA

#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <string>

#include "common/errors.h"
#include "common/settings.h"
#include "experiments/ipc_fused/fused.h"
#include "experiments/ipc_fused/ipc_two_step.h"
#include "plan/plan.h"
#include "transport/cuda_ipc.h"

namespace qcomm {

cudaError_t fusedPreload() { return gpu::ipcTwoStepPreload(); }

int64_t runFusedTwoStep(IpcTransport& ipc, const Plan& plan, at::Tensor& data, cudaStream_t stream,
                        std::chrono::milliseconds timeout, bool eager) {
  const IpcPeers p = ipc.peers(timeout);
  const int64_t tileElems = ipc.settings().tileElems > 0 ? ipc.settings().tileElems : kIpcTileElems;
  std::string why;
  const IpcGeometry g =
      ipcGeometry(plan.chunkElems, plan.rs, plan.ag, p.world, ipc.bufferBytes(), &why, tileElems);
  // the same on every rank (the buffer size and the tiles agreed at set-up): nothing enqueued yet
  TORCH_CHECK_VALUE(why.empty(), rankPrefix(p.rank, p.world), "allreduce: ", why);
  IpcTwoStepArgs a = ipcArgs(plan, p.rank, g, data.data_ptr(), p.buffers, p.timeoutNs, p.hostError);
  a.smCount = ipc.smCount();
  a.profile = ipc.deviceProfile();
  std::string cause;
  try {
    // a local launch shape (ranks may differ); a group-scoped setting, read at every call
    a.taskWarps = int(settings::number("QCOMM_IPC_TASK_WARPS"));
  } catch (const std::exception& e) {
    cause = e.what();
  }
  if (cause.empty()) {
    const cudaError_t e = gpu::ipcTwoStep(a, stream);
    if (e != cudaSuccess) {
      cause = std::string("launching the CUDA-IPC two_step failed (") + cudaGetErrorString(e) + ")";
    }
  }
  ipc.ended(stream, eager, cause);
  // bytes written into peers' buffers: every other chunk's tiles once (reduce), own tiles to
  // every peer (gather, whole 16-byte vectors)
  int64_t wire = 0;
  for (int c = 0; c < p.world; ++c) {
    const ChunkRange ch = plan.chunk(c);
    for (int64_t off = 0; off < ch.len; off += g.tileElems) {
      const int64_t len = std::min(g.tileElems, ch.len - off);
      wire += c == p.rank ? (p.world - 1) * alignUp16(encodedBytes(len, plan.ag))
                          : encodedBytes(len, plan.rs);
    }
  }
  return wire;
}

}  // namespace qcomm

#endif  // QCOMM_WITH_CUDA
