// Layout of the CUDA-IPC transport's buffers and the fused two_step's tiling: plain host code, no
// CUDA and no torch, so the CPU tests check it and the kernel (csrc/cuda/ipc_two_step.cu) and the
// host side (csrc/cuda_ipc.cpp) share one definition.
//
// Every rank allocates one buffer of the same size once and maps every peer's. A buffer holds:
//   [control: 256 B][reduce flags: kIpcMaxRanks x kIpcMaxSlots u32][gather flags: same][data]
// The flag arrays sit at fixed offsets whatever the call's config, so a word that held data in one
// call can never be read as a flag in another. The data region of one piece holds
//   reduce slots [source rank q][slot s] then gather slots [owner o][slot s],
// each slot one encoded tile (tileElems elements, whole groups, never straddling two chunks).
// A message larger than the buffer runs as several pieces; piece p covers tiles
// [p * pieceTiles, ...) of every chunk, so chunk ownership and every group's arithmetic are those
// of the plan, whatever the buffer size (bit-identity with the CPU path does not depend on it).
#pragma once

#include <cstdint>
#include <string>

#include "codec/codec.h"
#include "plan/plan.h"

namespace qcomm {

constexpr int kIpcMaxRanks = 8;
constexpr int64_t kIpcMaxSlots = 4096;
constexpr int64_t kIpcControlBytes = 256;
constexpr int64_t kIpcFlagBytes = int64_t(kIpcMaxRanks) * kIpcMaxSlots * 4;
constexpr int64_t kIpcReduceFlagsOffset = kIpcControlBytes;
constexpr int64_t kIpcGatherFlagsOffset = kIpcReduceFlagsOffset + kIpcFlagBytes;
constexpr int64_t kIpcDataOffset = kIpcGatherFlagsOffset + kIpcFlagBytes;
// control words (uint32 each): the epoch this rank last completed, and the abort word a rank that
// gives up sets in every peer's buffer so their spins end at once.
constexpr int64_t kIpcEpochOffset = 0;
constexpr int64_t kIpcAbortOffset = 64;
// the word a rank's first error claims (in device memory: atomics on host-mapped memory are not
// atomic everywhere) before it writes the record to host-mapped memory
constexpr int64_t kIpcErrorClaimOffset = 128;
// The separate-kernels two_step (QCOMM_IPC_KERNELS=separate, ipc_exchange.h): the barriers this
// rank has entered (written by its barrier kernel only), and the barrier flags
// [parity of the barrier's number][source rank], each holding the number of the last barrier its
// source entered with that parity. A peer runs at most one barrier ahead, so two parities keep a
// flag from being overwritten before its reader has seen it.
constexpr int64_t kIpcBarrierCountOffset = 160;
constexpr int64_t kIpcBarrierFlagsOffset = 192;
static_assert(kIpcBarrierFlagsOffset + 2 * 8 * 4 <= 256, "the barrier flags fit the control words");
// Elements per tile, before clipping to the chunk (QCOMM_IPC_TILE_ELEMS): a power of two in
// [kIpcMinTileElems, kIpcMaxTileElems], so a multiple of every group size (32..1024).
constexpr int64_t kIpcTileElems = 4096;
constexpr int64_t kIpcMinTileElems = 1024;
// Warps in a block of the fused kernel, and so the most (and default) warps per task group.
constexpr int kIpcBlockWarps = 8;
constexpr int64_t kIpcMaxTileElems = 65536;

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

// What a rank that gives up writes to host-mapped memory (first error wins; code 0 = none).
struct IpcError {
  uint32_t code;   // 1: timed out waiting for a peer; 2: a peer gave up (abort word set)
  uint32_t step;   // 1: reduce phase (waiting for a peer's tile), 2: gather phase, 3: a barrier
                   // of the separate kernels (ipc_exchange.h)
  uint32_t peer;   // the rank waited for
  uint32_t tile;   // the tile index within the chunk (step 3: the barrier's index in its call)
  uint32_t epoch;  // the piece's epoch (step 3: the barrier's number since set-up)
  uint32_t rank;   // the rank that gave up
};

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
  // barrier, so that one group's memory round trips, fences and waits overlap the others' work.
  // A local launch shape: the results do not depend on it.
  int taskWarps;
  // QCOMM_IPC_PROFILE: null, or kIpcProfileSlots host-mapped counters: per phase of the protocol
  // (ipc_protocol.h, IpcPhase) the clock cycles its blocks spent there, summed over blocks, then
  // the number of (block, piece) runs
  unsigned long long* profile;
  // QCOMM_IPC_RELEASE_FENCE=1: a system-scope fence (fence.sc.sys) before every flag's release
  // store, as the kernel did until 2026-11-30. 0 (the default): the release store alone, whose
  // release semantics cover the task group's writes that its barrier ordered before it (PTX
  // memory model: bar.sync synchronizes, release is cumulative). The same bytes either way.
  int releaseFence;
  // QCOMM_CUDA_PREFETCH=1: before each encode of its input, a task group asks L2 for the input
  // tile it encodes next (prefetchInput), so that the next encode's loads find it there. A hint:
  // the same bytes either way.
  int prefetch;
};

// The phases the profile splits a block's time into, in protocol order.
enum IpcPhase : int {
  kPhaseSendEncode,     // A: encode a tile into the owner's buffer (and the barrier after)
  kPhaseSendRelease,    // A: the flag's release (fence, store)
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

// The separate-kernels two_step's exchange of encoded bytes through the buffers' data regions
// (ipc_exchange.h): the data region is cut into two halves that rounds use in turn; in a round
// each rank copies up to roundBytes of its slot for rank j into rank j's current half, at
// [its rank * roundBytes].
struct IpcExchangeGeometry {
  int64_t halfBytes = 0;   // bytes of each half
  int64_t roundBytes = 0;  // bytes of one rank's slot per round, a multiple of 16 (0: too small)
};

// The exchange geometry of a buffer of bufferBytes for `world` ranks; roundBytes is 0 and *error
// says why when the buffer cannot hold 16 bytes per rank in each half.
IpcExchangeGeometry ipcExchangeGeometry(int world, int64_t bufferBytes, std::string* error);

// The arguments of one rank's call of `plan` (a quantized two_step) over the mapped buffers.
IpcTwoStepArgs ipcArgs(const Plan& plan, int rank, const IpcGeometry& g, void* data,
                       uint8_t* const* buffers, int64_t timeoutNs, IpcError* error);

// The sentence for a recorded error (code != 0), after the rank prefix.
std::string describeIpcError(const IpcError& e);

// Bytes of the data region a piece of pieceTiles tiles uses (both phases, all ranks).
inline int64_t ipcPieceBytes(const IpcGeometry& g, int world) {
  return 2 * int64_t(world) * g.pieceTiles * g.slotBytes;
}

}  // namespace qcomm
