// ThreadSanitizer harness for the separate kernels' exchange (csrc/transport/ipc_exchange.h) as
// the host emulation runs it (csrc/testing/ipc_emulation.h: memcpy, and the barrier of
// csrc/cuda/ipc_barrier.h on host memory): W ranks as threads over shared host buffers, slots of
// several rounds (copied out) and of one (read where they landed), several calls carrying the
// barrier counts. TSan reports any pair of accesses to a buffer's bytes that the barriers'
// release/acquire pairs do not order, the class of bug the copy and barrier kernels would share.
// Run by scripts/tsan_ipc.sh; exits non-zero on a race (TSan), a byte out of place or a barrier
// that gave up. (The fused experiment's protocol has its own harness:
// tests/experiments/native/fused_race.cpp.)
#include <ATen/Parallel.h>

#include "exchange_check.h"

using namespace qcomm;

int main() {
  at::set_num_threads(1);  // torch's own threads are not instrumented
  // slots of 3 rounds, and of one (4000 and 16 bytes: left in the buffers)
  const bool delivered =
      exchangeCalls<HostCopies>("exchange", 4, 4096, {10000, 10016, 4000, 16, 10064, 4000});
  return delivered ? 0 : 6;
}
