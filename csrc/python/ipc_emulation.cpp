// The host emulation of the separate kernels' barrier (ipc_emulation.h).
#include "python/ipc_emulation.h"

namespace qcomm {
namespace {

struct HostBarrierExec {
  const IpcPeers& p;
  void release(uint32_t* flag, uint32_t v) const { ipc::hostStoreRelease(flag, v); }
  bool wait(const uint32_t* flag, uint32_t value, uint32_t step, int peer, int64_t index) const {
    return ipc::hostSpinWait(p, flag, value, step, peer, index);
  }
};

}  // namespace

bool ipcBarrierEmulate(const IpcPeers& p, uint32_t index) {
  HostBarrierExec ex{p};
  return ipc::barrier(ex, p.buffers, p.rank, p.world, index);
}

}  // namespace qcomm
