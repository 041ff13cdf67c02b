// The fused two_step experiment's tiling and arguments (fused_layout.h).
#include "experiments/ipc_fused/fused_layout.h"

#include <algorithm>

#include "plan/plan.h"

namespace qcomm {

IpcGeometry ipcGeometry(int64_t chunkElems, const CodecSpec& rs, const CodecSpec& ag, int world,
                        int64_t bufferBytes, std::string* error, int64_t tileElems) {
  IpcGeometry g;
  std::string why;
  g.tileElems = std::max<int64_t>(1, std::min<int64_t>(tileElems, chunkElems));
  g.slotBytes = alignUp16(std::max(encodedBytes(g.tileElems, rs), encodedBytes(g.tileElems, ag)));
  g.tilesPerChunk = (chunkElems + g.tileElems - 1) / g.tileElems;
  const int64_t data = bufferBytes - kIpcDataOffset;
  const int64_t fit = data > 0 ? data / (2 * int64_t(world) * g.slotBytes) : 0;
  g.pieceTiles = std::min({fit, kIpcMaxSlots, std::max<int64_t>(g.tilesPerChunk, 1)});
  if (world > kIpcMaxRanks) {
    why = "the CUDA-IPC transport takes at most " + std::to_string(kIpcMaxRanks) + " ranks";
  } else if (g.pieceTiles < 1) {
    why = "the CUDA-IPC buffer (" + std::to_string(bufferBytes) +
          " bytes) cannot hold one tile per rank (" +
          std::to_string(kIpcDataOffset + 2 * int64_t(world) * g.slotBytes) +
          " bytes needed); raise QCOMM_IPC_BUFFER_MB or lower QCOMM_IPC_TILE_ELEMS";
    g.pieceTiles = 0;
  }
  g.pieces = why.empty() ? (g.tilesPerChunk + g.pieceTiles - 1) / g.pieceTiles : 0;
  if (error) *error = why;
  return g;
}

IpcTwoStepArgs ipcArgs(const Plan& plan, int rank, const IpcGeometry& g, void* data,
                       uint8_t* const* buffers, int64_t timeoutNs, IpcError* error) {
  IpcTwoStepArgs a{};
  a.data = data;
  a.dtype = plan.dtype;
  a.numel = plan.numel;
  a.chunkElems = plan.chunkElems;
  a.rs = plan.rs;
  a.ag = plan.ag;
  a.world = plan.world;
  a.rank = rank;
  a.average = plan.average ? 1 : 0;
  a.rsNoise = rsNoise(plan, rank, 0);
  a.agNoise = agNoise(plan, rank, 0);
  for (int r = 0; r < plan.world && r < kIpcMaxRanks; ++r) a.buffers[r] = buffers[r];
  a.geometry = g;
  a.timeoutNs = timeoutNs;
  a.hostError = error;
  a.taskWarps = kIpcBlockWarps;
  return a;
}

const char* const kIpcPhaseNames[kIpcPhases] = {
    "send_encode", "send_release",   "own_encode", "own_wait",    "sum_encode",
    "copy_out",    "gather_release", "own_decode", "gather_wait", "gather_decode"};

}  // namespace qcomm
