// Layout of the CUDA-IPC buffers: plain host code, no CUDA and no torch, so the CPU tests check
// it and the kernels (ipc_kernels.cu) and the host side (csrc/transport/cuda_ipc.cpp) share one
// definition.
//
// Every rank allocates one buffer of the same size once and maps every peer's. A buffer holds:
//   [control: 256 B][flags: 2 x kIpcMaxRanks x kIpcMaxSlots u32][data]
// The control words are below. The flag arrays are the fused two_step experiment's
// (csrc/experiments/ipc_fused/); they keep their place in every build, so that the data region
// starts at the same offset whatever kernels a group runs. The separate kernels' exchange
// (csrc/transport/ipc_exchange.h) cuts the data region into two halves that rounds use in turn.
#pragma once

#include <cstdint>
#include <string>

namespace qcomm {

constexpr int kIpcMaxRanks = 8;
constexpr int64_t kIpcMaxSlots = 4096;
constexpr int64_t kIpcControlBytes = 256;
constexpr int64_t kIpcFlagBytes = int64_t(kIpcMaxRanks) * kIpcMaxSlots * 4;
constexpr int64_t kIpcReduceFlagsOffset = kIpcControlBytes;
constexpr int64_t kIpcGatherFlagsOffset = kIpcReduceFlagsOffset + kIpcFlagBytes;
constexpr int64_t kIpcDataOffset = kIpcGatherFlagsOffset + kIpcFlagBytes;
// control words (uint32 each): the epoch this rank last completed (the fused experiment's), and
// the abort word a rank that gives up sets in every peer's buffer so their spins end at once.
constexpr int64_t kIpcEpochOffset = 0;
constexpr int64_t kIpcAbortOffset = 64;
// The call fingerprints of the separate kernels (ipc_barrier.h): word [src] holds the fingerprint
// of the plan (csrc/plan/plan.h planFingerprint) with which rank src entered its last call's first
// barrier, written by src before it releases that barrier's flag, read by the owner after.
constexpr int64_t kIpcFingerprintOffset = 96;
// the word a rank's first error claims (in device memory: atomics on host-mapped memory are not
// atomic everywhere) before it writes the record to host-mapped memory
constexpr int64_t kIpcErrorClaimOffset = 128;
// The separate kernels' barriers (ipc_barrier.h): the barriers this rank has entered (written by
// its barrier kernel only), and the barrier flags [parity of the barrier's number][source rank],
// each holding the number of the last barrier its source entered with that parity. A peer runs at
// most one barrier ahead, so two parities keep a flag from being overwritten before its reader
// has seen it.
constexpr int64_t kIpcBarrierCountOffset = 160;
constexpr int64_t kIpcBarrierFlagsOffset = 192;
static_assert(kIpcBarrierFlagsOffset + 2 * 8 * 4 <= 256, "the barrier flags fit the control words");
static_assert(kIpcFingerprintOffset >= kIpcAbortOffset + 4 &&
                  kIpcFingerprintOffset + kIpcMaxRanks * 4 <= kIpcErrorClaimOffset,
              "the fingerprints fit between the abort word and the error claim");

// What a rank that gives up writes to host-mapped memory (first error wins; code 0 = none).
struct IpcError {
  uint32_t code;   // 1: timed out waiting for a peer; 2: a peer gave up (abort word set);
                   // 3: a peer's call differs from this rank's (its plan fingerprint)
  uint32_t step;   // 1: reduce phase (waiting for a peer's tile), 2: gather phase (both of the
                   // fused experiment), 3: a barrier of the separate kernels
  uint32_t peer;   // the rank waited for
  uint32_t tile;   // the tile index within the chunk (step 3: the barrier's index in its call;
                   // code 3: the peer's fingerprint)
  uint32_t epoch;  // the piece's epoch (step 3: the barrier's number since set-up; code 3: this
                   // rank's fingerprint)
  uint32_t rank;   // the rank that gave up
};

// What every wait of an IPC kernel needs: every rank's buffer, mapped in this process (its own
// too), this rank, the bound of a spin and where to record an error.
struct IpcPeers {
  uint8_t* buffers[kIpcMaxRanks];
  int world, rank;
  int64_t timeoutNs;
  IpcError* hostError;  // host-mapped
};

// The separate kernels' exchange geometry (ipc_exchange.h): the data region is cut into two halves
// that rounds use in turn; in a round each rank copies up to roundBytes of its slot for rank j
// into rank j's current half, at [its rank * roundBytes].
struct IpcExchangeGeometry {
  int64_t halfBytes = 0;   // bytes of each half
  int64_t roundBytes = 0;  // bytes of one rank's slot per round, a multiple of 16 (0: too small)
};

// The exchange geometry of a buffer of bufferBytes for `world` ranks; roundBytes is 0 and *error
// says why when the buffer cannot hold 16 bytes per rank in each half.
IpcExchangeGeometry ipcExchangeGeometry(int world, int64_t bufferBytes, std::string* error);

// The sentence for a recorded error (code != 0), after the rank prefix.
std::string describeIpcError(const IpcError& e);

// Sets the abort word (kIpcAbortOffset) of every rank's buffer, through set(word) (a nonzero
// store: a memset on the device, a release store on the host), so that every rank's spins end at
// once: what a rank does when its call fails outside its kernels (a launch failing part-way, and
// an error before the call's launches: IpcTransport::abortPeers and abandon; the host emulation,
// csrc/testing/ipc_emulation.cpp). `buffers`: every rank's buffer as mapped here, null where not.
template <class Set>
void ipcSetAbortWords(uint8_t* const* buffers, int world, Set&& set) {
  for (int r = 0; r < world && r < kIpcMaxRanks; ++r) {
    if (buffers[r] != nullptr) set(reinterpret_cast<uint32_t*>(buffers[r] + kIpcAbortOffset));
  }
}

// What every later call of a rank raises (after the rank prefix) once a call of its failed before
// its launches with `cause` and the rank set the abort words (IpcTransport::abandon).
std::string ipcAbandonedError(const std::string& cause);

}  // namespace qcomm
