// The CUDA-IPC buffers' exchange geometry and error sentences (ipc_layout.h).
#include "cuda/ipc_layout.h"

#include <cstdio>

namespace qcomm {

IpcExchangeGeometry ipcExchangeGeometry(int world, int64_t bufferBytes, std::string* error) {
  IpcExchangeGeometry g;
  std::string why;
  const int64_t data = bufferBytes - kIpcDataOffset;
  if (world < 1 || world > kIpcMaxRanks) {
    why = "the CUDA-IPC transport takes at most " + std::to_string(kIpcMaxRanks) + " ranks";
  } else {
    g.halfBytes = data > 0 ? data / 2 / 16 * 16 : 0;
    g.roundBytes = g.halfBytes / world / 16 * 16;
    if (g.roundBytes < 16) {
      why = "the CUDA-IPC buffer (" + std::to_string(bufferBytes) +
            " bytes) cannot hold 16 bytes per rank in each half (" +
            std::to_string(kIpcDataOffset + 2 * 16 * int64_t(world)) +
            " bytes needed); raise QCOMM_IPC_BUFFER_MB";
      g.roundBytes = 0;
    }
  }
  if (error) *error = why;
  return g;
}

std::string describeIpcError(const IpcError& e) {
  const std::string step =
      e.step == 1   ? "reduce phase"
      : e.step == 2 ? "gather phase"
                    : "separate kernels' barrier " + std::to_string(e.tile) + " of its call";
  const std::string where =
      e.step == 3 ? " waiting for rank " + std::to_string(e.peer) + " (barrier " +
                        std::to_string(e.epoch) + " since set-up)"
                  : " waiting for rank " + std::to_string(e.peer) + "'s tile " +
                        std::to_string(e.tile) + " (epoch " + std::to_string(e.epoch) + ")";
  const std::string after =
      ". This group's CUDA allreduces cannot continue: destroy it and create a new one.";
  if (e.code == 3) {
    char prints[64];
    std::snprintf(prints, sizeof(prints), "%08x here, %08x on rank %u", e.epoch, e.tile, e.peer);
    return "allreduce (CUDA IPC): the ranks disagree on this call: rank " + std::to_string(e.rank) +
           "'s plan fingerprint differs from rank " + std::to_string(e.peer) + "'s (" + prints +
           "): the numel, dtype, op or QuantConfig differs, or a rank made a quantized CUDA "
           "allreduce that another did not. Every rank must make the same calls in the same "
           "order; QCOMM_DEBUG=CHECK names the field that differs (a host exchange per call)" +
           after;
  }
  if (e.code == 1) {
    return "allreduce (CUDA IPC): rank " + std::to_string(e.rank) + " timed out in the " + step +
           where + "; a peer may have died, stopped, or called a different collective" + after;
  }
  return "allreduce (CUDA IPC): rank " + std::to_string(e.rank) +
         " stopped because a peer gave up (" + step + "," + where + "); see that rank's error" +
         after;
}

std::string ipcAbandonedError(const std::string& cause) {
  return "allreduce: an earlier call failed on this rank before its launches (" + cause +
         "); its peers were stopped. This group's CUDA allreduces cannot continue: destroy it and "
         "create a new one.";
}

}  // namespace qcomm
