// A host emulation of the separate kernels over CUDA IPC, for the CPU tests: the barrier of
// csrc/cuda/ipc_barrier.h run by one CPU thread per rank over host buffers, and the host executor
// of the exchange's copy schedule (csrc/transport/ipc_exchange.h). The host spin and error record
// are csrc/cuda/ipc_host_sync.h's.
#pragma once

#include <cstring>
#include <vector>

#include "cuda/ipc_barrier.h"
#include "cuda/ipc_host_sync.h"
#include "cuda/ipc_layout.h"

namespace qcomm {

// One barrier on host buffers, by this thread as rank p.rank, bounded by p.timeoutNs; with a
// fingerprint it compares the ranks' (a call's first barrier); false when it gave up (the error is
// in p.hostError, host memory shared by the ranks).
bool ipcBarrierEmulate(const IpcPeers& p, uint32_t index, const uint32_t* fingerprint = nullptr);

// The host side of gpu::ipcPoisonIfAborted: every byte of `data` 0xFF if this rank's abort word is
// set.
void ipcPoisonIfAbortedEmulate(const IpcPeers& p, uint8_t* data, int64_t bytes);

// The host side of IpcTransport::abandon: rank p.rank's call failed before its launches while
// the ranks `waiting` are in the call's first barrier, waiting for it. Once each of them has
// released that barrier's flag into this rank's buffer, sets every rank's abort word as abandon
// does (ipcSetAbortWords, ipc_layout.h), so that their barriers stop at once. False, setting
// nothing, if one has not come within p.timeoutNs.
bool ipcAbandonEmulate(const IpcPeers& p, const std::vector<int>& waiting);

// The host executor of the exchange: memcpy, and the barrier above.
struct HostCopies {
  IpcPeers peers;
  void copy(uint8_t* dst, const uint8_t* src, int64_t bytes) {
    std::memcpy(dst, src, size_t(bytes));
  }
  void flush() {}
  bool barrier(uint32_t index, const uint32_t* fingerprint = nullptr) {
    return ipcBarrierEmulate(peers, index, fingerprint);
  }
  const char* failure() const { return ""; }
};

}  // namespace qcomm
