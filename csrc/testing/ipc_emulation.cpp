// The host emulation of the separate kernels' barrier (ipc_emulation.h).
#include "testing/ipc_emulation.h"

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

bool ipcAbandonEmulate(const IpcPeers& p, const std::vector<int>& waiting) {
  // this rank's next barrier: the number every peer releases on entering it (ipc_barrier.h)
  const uint32_t number = *ipc::word(p.buffers[p.rank], kIpcBarrierCountOffset) + 1u;
  const auto start = std::chrono::steady_clock::now();
  for (int q : waiting) {
    const uint32_t* flag = ipc::barrierFlag(p.buffers[p.rank], number, q);
    while (ipc::hostLoadAcquire(flag) != number) {
      const auto waited = std::chrono::steady_clock::now() - start;
      if (std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count() > p.timeoutNs) {
        return false;
      }
      std::this_thread::yield();
    }
  }
  ipcSetAbortWords(p.buffers, p.world, [](uint32_t* word) { ipc::hostStoreRelease(word, 1u); });
  return true;
}

void ipcPoisonIfAbortedEmulate(const IpcPeers& p, uint8_t* data, int64_t bytes) {
  if (ipc::hostLoadAcquire(ipc::word(p.buffers[p.rank], kIpcAbortOffset)) == 0u) return;
  if (bytes > 0) std::memset(data, 0xFF, size_t(bytes));
}

}  // namespace qcomm
