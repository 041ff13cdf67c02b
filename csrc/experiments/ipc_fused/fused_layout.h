// The fused two_step experiment's tiling of the CUDA-IPC buffers and its kernel's arguments: plain
// host code, no CUDA and no torch, shared by the kernel (ipc_two_step.cu), its host emulation
// (fused_host.cpp) and its launch (fused_run.cpp). Built with QCOMM_EXPERIMENTS=1 only.
//
// The buffer is csrc/cuda/ipc_layout.h's: [control: 256 B][reduce flags: kIpcMaxRanks x
// kIpcMaxSlots u32][gather flags: same][data]. The flag arrays sit at fixed offsets whatever the
// call's config, so a word that held data in one call can never be read as a flag in another. The
// data region of one piece holds
//   reduce slots [source rank q][slot s] then gather slots [owner o][slot s],
// each slot one encoded tile (tileElems elements, whole groups, never straddling two chunks).
// A message larger than the buffer runs as several pieces; piece p covers tiles
// [p * pieceTiles, ...) of every chunk, so chunk ownership and every group's arithmetic are those
// of the plan, whatever the buffer size (bit-identity with the CPU path does not depend on it).
#pragma once

#include <cstdint>
#include <string>

#include "codec/codec.h"
#include "cuda/ipc_layout.h"

namespace qcomm {

struct Plan;

// Elements per tile, before clipping to the chunk (QCOMM_IPC_TILE_ELEMS): a power of two in
// [kIpcMinTileElems, kIpcMaxTileElems], so a multiple of every group size (32..1024).
constexpr int64_t kIpcTileElems = 4096;
constexpr int64_t kIpcMinTileElems = 1024;
constexpr int64_t kIpcMaxTileElems = 65536;
// Warps in a block of the fused kernel, and so the most (and default) warps per task group.
constexpr int kIpcBlockWarps = 8;

struct IpcGeometry {
  int64_t tileElems = 0;  // elements per tile (the last tile of a chunk may be shorter)
  int64_t slotBytes = 0;  // bytes per slot: the larger encoded tile of the two phases, 16-aligned
  int64_t tilesPerChunk = 0;  // tiles of a full chunk
  int64_t pieceTiles = 0;     // tiles of each chunk per piece (slots per source or owner)
  int64_t pieces = 0;         // launches per call (0: it does not fit, see `error`)
};

// The tiling of a two_step plan (chunkElems, codecs, world) into a buffer of bufferBytes. When it
// cannot run (too many ranks, a buffer that holds not even one tile per rank) `pieces` is 0 and
// *error says why. (Plain data: the geometry travels to the kernel as an argument.)
IpcGeometry ipcGeometry(int64_t chunkElems, const CodecSpec& rs, const CodecSpec& ag, int world,
                        int64_t bufferBytes, std::string* error, int64_t tileElems = kIpcTileElems);

// Tiles of each chunk in piece p (host and device).
QCOMM_HD int64_t pieceSlots(const IpcGeometry& g, int64_t piece) {
  const int64_t left = g.tilesPerChunk - piece * g.pieceTiles;
  return left < g.pieceTiles ? left : g.pieceTiles;
}

// Bytes of the data region a piece of pieceTiles tiles uses (both phases, all ranks).
inline int64_t ipcPieceBytes(const IpcGeometry& g, int world) {
  return 2 * int64_t(world) * g.pieceTiles * g.slotBytes;
}

// One rank's call of the fused kernel. buffers, world, rank, timeoutNs and hostError are
// IpcPeers' fields, so the shared spin helpers (csrc/cuda/ipc_sync.cuh, ipc_host_sync.h) take it.
struct IpcTwoStepArgs {
  void* data;  // the message, in place (dtype elements, numel of them)
  int32_t dtype;
  int64_t numel;
  int64_t chunkElems;
  CodecSpec rs, ag;
  int world, rank;
  int average;
  Noise rsNoise, agNoise;          // salts of this rank's reduce/gather encodes; base unused
  uint8_t* buffers[kIpcMaxRanks];  // every rank's buffer, mapped in this process (own too)
  IpcGeometry geometry;
  int64_t timeoutNs;    // bound on every spin
  IpcError* hostError;  // host-mapped
  int smCount;
  // QCOMM_IPC_TASK_WARPS: the warps of a block that take a task together (1, 2, 4 or 8 = the
  // whole block). Below 8, a block runs 8 / taskWarps independent task groups, each with its own
  // barrier, so that one group's memory round trips and waits overlap the others' work. A local
  // launch shape: the results do not depend on it.
  int taskWarps;
  // QCOMM_IPC_PROFILE: null, or kIpcProfileSlots host-mapped counters: per phase of the protocol
  // (IpcPhase) the clock cycles its blocks spent there, summed over blocks, then the number of
  // (block, piece) runs
  unsigned long long* profile;
};

// The arguments of one rank's call of `plan` (a quantized two_step) over the mapped buffers: one
// task group per block, no profile, smCount 0 (the caller sets those).
IpcTwoStepArgs ipcArgs(const Plan& plan, int rank, const IpcGeometry& g, void* data,
                       uint8_t* const* buffers, int64_t timeoutNs, IpcError* error);

// The phases the profile splits a block's time into, in protocol order.
enum IpcPhase : int {
  kPhaseSendEncode,     // A: encode a tile into the owner's buffer (and the barrier after)
  kPhaseSendRelease,    // A: the flag's release store
  kPhaseOwnEncode,      // B: encode this rank's own copy
  kPhaseOwnWait,        // B: wait for every peer's copy
  kPhaseSumEncode,      // B: decode and sum the W copies, encode the sum
  kPhaseCopyOut,        // B: copy the encoded sum into every peer's buffer
  kPhaseGatherRelease,  // B: release the peers' gather flags
  kPhaseOwnDecode,      // B: decode this rank's own output
  kPhaseGatherWait,     // C: wait for an owner's encoded sum
  kPhaseGatherDecode,   // C: decode it into place
  kIpcPhases
};
constexpr int kIpcProfileSlots = kIpcPhases + 1;  // + the number of (block, piece) runs
extern const char* const kIpcPhaseNames[kIpcPhases];

}  // namespace qcomm
