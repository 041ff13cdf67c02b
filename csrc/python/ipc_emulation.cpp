// The host emulation of the separate kernels' barrier (ipc_emulation.h).
#include "python/ipc_emulation.h"

namespace qcomm {
namespace {

struct HostBarrierExec {
  const IpcPeers& p;
  void release(uint32_t* flag, uint32_t v) const { ipc::hostStoreRelease(flag, v); }
  uint32_t load(const uint32_t* flag) const { return ipc::hostLoadAcquire(flag); }
  bool wait(const uint32_t* flag, uint32_t value, uint32_t step, int peer, int64_t index) const {
    return ipc::hostSpinWait(p, flag, value, step, peer, index);
  }
  bool mismatch(int peer, uint32_t theirs, uint32_t mine) const {
    return ipc::hostGiveUp(p, 3u, 3u, peer, int64_t(theirs), mine);
  }
};

}  // namespace

bool ipcBarrierEmulate(const IpcPeers& p, uint32_t index, const uint32_t* fingerprint) {
  HostBarrierExec ex{p};
  return ipc::barrier(ex, p.buffers, p.rank, p.world, index, fingerprint != nullptr,
                      fingerprint != nullptr ? *fingerprint : 0u);
}

void ipcPoisonIfAbortedEmulate(const IpcPeers& p, uint8_t* data, int64_t bytes) {
  if (ipc::hostLoadAcquire(ipc::word(p.buffers[p.rank], kIpcAbortOffset)) == 0u) return;
  if (bytes > 0) std::memset(data, 0xFF, size_t(bytes));
}

}  // namespace qcomm
