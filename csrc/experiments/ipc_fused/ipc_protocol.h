// The fused two_step's protocol over CUDA-IPC buffers, written once for two executors: the CUDA
// kernel (ipc_two_step.cu, one block per SM, threads and warps) and a host emulation
// (fused_host.cpp, one thread per rank over host memory, the CPU codec) that the CPU tests run
// against the reference. Both execute this file's task loop, addressing, tiling, flag protocol
// and epochs; only the per-tile codec work and the synchronization primitives differ, and the
// CUDA codec's are tested bit for bit against the CPU codec on a GPU
// (tests/cuda/test_cuda_codec.py). Built with QCOMM_EXPERIMENTS=1 only.
//
// Each executor `ex` provides: epochBase(), encodeReduce(tile, dst), sumEncode(tile, slot, out),
// copy16(dst, src, vectors), decodeOut(src, tile), barrier(), leader(), release(flag, v),
// wait(flag, epoch, step, peer, tile) (leader only; false = gave up), setGiveUp()/gaveUp(), and
// mark(phase): the time since the previous mark belongs to `phase` (IpcPhase; -1 starts the
// clock), which the kernel counts when profiling and the host emulation ignores.
//
// Phases of one piece, in this order for every block (see ipc_two_step.cu for the argument that
// they cannot deadlock and that no slot is overwritten before it is read):
//   A. reduce sends: tile t of chunk c (peers in rotated order) encoded into rank c's slot
//      [rank][t], then rank c's reduce flag [rank][t] := epoch (release);
//   B. own tiles: own copy into own slot, wait for every peer's flag, sum the W decoded copies in
//      rank order, encode with the gather codec, copy to every peer's gather slot [rank][t],
//      release their gather flags, decode own output from the same bytes;
//   C. gather: wait for owner o's gather flag [o][t], decode its bytes into place.
#pragma once

#include "cuda/ipc_barrier.h"  // ipc::word, QCOMM_PROTO_FN
#include "cuda/ipc_layout.h"
#include "experiments/ipc_fused/fused_layout.h"

namespace qcomm {
namespace ipc {

QCOMM_PROTO_FN uint32_t* reduceFlag(uint8_t* buf, int src, int64_t slot) {
  return word(buf, kIpcReduceFlagsOffset) + int64_t(src) * kIpcMaxSlots + slot;
}

QCOMM_PROTO_FN uint32_t* gatherFlag(uint8_t* buf, int owner, int64_t slot) {
  return word(buf, kIpcGatherFlagsOffset) + int64_t(owner) * kIpcMaxSlots + slot;
}

QCOMM_PROTO_FN uint8_t* reduceSlot(uint8_t* buf, const IpcGeometry& g, int src, int64_t slot) {
  return buf + kIpcDataOffset + (int64_t(src) * g.pieceTiles + slot) * g.slotBytes;
}

QCOMM_PROTO_FN uint8_t* gatherSlot(uint8_t* buf, const IpcGeometry& g, int world, int owner,
                                   int64_t slot) {
  return buf + kIpcDataOffset + ((int64_t(world) + owner) * g.pieceTiles + slot) * g.slotBytes;
}

// Element range of tile t of chunk c; len <= 0 when the chunk has no such tile.
struct Tile {
  int64_t begin;
  int64_t len;
};

QCOMM_PROTO_FN Tile tileOf(const IpcTwoStepArgs& a, int c, int64_t t) {
  const int64_t chunkBegin = int64_t(c) * a.chunkElems;
  int64_t chunkLen = a.numel - chunkBegin;
  chunkLen = chunkLen < a.chunkElems ? chunkLen : a.chunkElems;
  const int64_t off = t * a.geometry.tileElems;
  int64_t len = chunkLen - off;
  len = len < a.geometry.tileElems ? len : a.geometry.tileElems;
  return {chunkBegin + off, len};
}

// One block's share (tasks block, block + blocks, ...) of piece `piece`. Returns false when a
// wait gave up (the error is recorded; the caller stops).
template <class Exec>
QCOMM_PROTO_FN bool runPiece(Exec& ex, const IpcTwoStepArgs& a, int64_t piece, int64_t block,
                             int64_t blocks) {
  const IpcGeometry& g = a.geometry;
  uint8_t* own = a.buffers[a.rank];
  const uint32_t epoch = ex.epochBase() + 1u + uint32_t(piece);
  const int64_t first = piece * g.pieceTiles;
  const int64_t slots = pieceSlots(g, piece);
  const int peers = a.world - 1;
  ex.mark(-1);

  // A. reduce sends
  const int64_t sends = int64_t(peers) * slots;
  for (int64_t task = block; task < sends; task += blocks) {
    const int c = (a.rank + 1 + int(task / slots)) % a.world;
    const int64_t s = task % slots;
    const Tile tile = tileOf(a, c, first + s);
    if (tile.len <= 0) continue;
    ex.encodeReduce(tile, reduceSlot(a.buffers[c], g, a.rank, s));
    ex.barrier();
    ex.mark(kPhaseSendEncode);
    if (ex.leader()) ex.release(reduceFlag(a.buffers[c], a.rank, s), epoch);
    ex.mark(kPhaseSendRelease);
  }

  // B. own tiles
  for (int64_t s = block; s < slots; s += blocks) {
    const Tile tile = tileOf(a, a.rank, first + s);
    if (tile.len <= 0) continue;
    ex.encodeReduce(tile, reduceSlot(own, g, a.rank, s));
    ex.mark(kPhaseOwnEncode);
    if (ex.leader()) {
      for (int j = 1; j <= peers; ++j) {
        const int q = (a.rank + j) % a.world;
        if (!ex.wait(reduceFlag(own, q, s), epoch, 1u, q, first + s)) {
          ex.setGiveUp();
          break;
        }
      }
    }
    ex.barrier();
    ex.mark(kPhaseOwnWait);
    if (ex.gaveUp()) return false;
    uint8_t* out = gatherSlot(own, g, a.world, a.rank, s);
    ex.sumEncode(tile, s, out);
    ex.barrier();
    ex.mark(kPhaseSumEncode);
    const int64_t vectors = alignUp16(encodedBytes(tile.len, a.ag)) / 16;
    for (int j = 1; j <= peers; ++j) {
      const int o = (a.rank + j) % a.world;
      ex.copy16(gatherSlot(a.buffers[o], g, a.world, a.rank, s), out, vectors);
    }
    ex.barrier();
    ex.mark(kPhaseCopyOut);
    if (ex.leader()) {
      for (int j = 1; j <= peers; ++j) {
        ex.release(gatherFlag(a.buffers[(a.rank + j) % a.world], a.rank, s), epoch);
      }
    }
    ex.mark(kPhaseGatherRelease);
    ex.decodeOut(out, tile);
    ex.barrier();
    ex.mark(kPhaseOwnDecode);
  }

  // C. gather
  for (int64_t task = block; task < int64_t(peers) * slots; task += blocks) {
    const int o = (a.rank + 1 + int(task / slots)) % a.world;
    const int64_t s = task % slots;
    const Tile tile = tileOf(a, o, first + s);
    if (tile.len <= 0) continue;
    if (ex.leader() && !ex.wait(gatherFlag(own, o, s), epoch, 2u, o, first + s)) ex.setGiveUp();
    ex.barrier();
    ex.mark(kPhaseGatherWait);
    if (ex.gaveUp()) return false;
    ex.decodeOut(gatherSlot(own, g, a.world, o, s), tile);
    ex.barrier();
    ex.mark(kPhaseGatherDecode);
  }
  return true;
}

}  // namespace ipc
}  // namespace qcomm
