// The SIMT emulator's runtime (see simt.h): blocks on OS threads, CUDA threads as fibers, the
// synchronising operations as cooperative barriers, and the few CUDA runtime calls the kernels'
// launch code makes, answered as a small device would (QCOMM_SIMT_SMS multiprocessors, default 2,
// one resident block each, so grid-stride loops take several turns).
#include "simt.h"

#include <sched.h>
#include <ucontext.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace qcomm {
namespace simt {
namespace {

constexpr size_t kStackBytes = 128 << 10;

struct Fiber {
  ucontext_t ctx;
  Dim tid{0, 0, 0};
  bool done = false;
  const uint64_t* waitGen = nullptr;  // while waiting at a barrier: its generation counter
  uint64_t waitVal = 0;               // and the value it had on arrival
  std::unique_ptr<char[]> stack;
};

struct Warp {
  int lanes = 0;  // threads of the block in this warp
  int live = 0;   // of them not exited
  int arrived = 0;
  uint64_t gen = 0;
  Op op = Op::kSyncWarp;
  uint64_t slots[32] = {};
};

struct Block {
  Dim bid, bdim, gdim;
  const std::function<void()>* body = nullptr;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  int live = 0;
  int arrived = 0;
  uint64_t gen = 0;
  ucontext_t sched;
  int cur = -1;
};

thread_local Block* tlBlock = nullptr;

[[noreturn]] void fail(const Block& b, const char* what) {
  std::fprintf(stderr, "simt: block %u, thread %d (warp %d): %s\n", b.bid.x, b.cur, b.cur / 32,
               what);
  std::fflush(stderr);
  std::abort();
}

Block& block() {
  if (tlBlock == nullptr || tlBlock->cur < 0) {
    std::fprintf(stderr, "simt: a device function was called outside a kernel launch\n");
    std::abort();
  }
  return *tlBlock;
}

Fiber& self() { return block().fibers[size_t(block().cur)]; }

void yieldToScheduler() {
  Block& b = block();
  Fiber& f = b.fibers[size_t(b.cur)];
  swapcontext(&f.ctx, &b.sched);
}

// Wait until *gen moves past `was` (another fiber released the barrier).
void waitFor(const uint64_t* gen, uint64_t was) {
  Fiber& f = self();
  f.waitGen = gen;
  f.waitVal = was;
  while (*gen == was) yieldToScheduler();
  f.waitGen = nullptr;
}

void fiberMain() {
  Block& b = *tlBlock;
  (*b.body)();
  Fiber& f = b.fibers[size_t(b.cur)];
  f.done = true;
  Warp& w = b.warps[size_t(b.cur / 32)];
  --w.live;
  --b.live;
  if (w.arrived > 0 && w.arrived == w.live) {
    fail(b, "a lane exited while the rest of its warp waits at a full-mask warp operation");
  }
  if (b.arrived > 0 && b.arrived == b.live) {  // exited threads no longer count at __syncthreads
    b.arrived = 0;
    ++b.gen;
  }
  // returning resumes the scheduler (uc_link)
}

void runBlock(Dim bid, Dim bdim, Dim gdim, const std::function<void()>& body) {
  Block b;
  b.bid = bid;
  b.bdim = bdim;
  b.gdim = gdim;
  b.body = &body;
  const int n = int(bdim.x);
  b.fibers.resize(size_t(n));
  b.warps.resize(size_t((n + 31) / 32));
  b.live = n;
  for (int i = 0; i < n; ++i) {
    Warp& w = b.warps[size_t(i / 32)];
    ++w.lanes;
    ++w.live;
  }
  tlBlock = &b;
  for (int i = 0; i < n; ++i) {
    Fiber& f = b.fibers[size_t(i)];
    f.tid = Dim{unsigned(i), 0, 0};
    f.stack.reset(new char[kStackBytes]);
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.get();
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = &b.sched;
    makecontext(&f.ctx, fiberMain, 0);
  }
  int remaining = n;
  while (remaining > 0) {
    bool ran = false;
    for (int i = 0; i < n; ++i) {
      Fiber& f = b.fibers[size_t(i)];
      if (f.done || (f.waitGen != nullptr && *f.waitGen == f.waitVal)) continue;
      ran = true;
      b.cur = i;
      swapcontext(&b.sched, &f.ctx);
      if (f.done) --remaining;
    }
    b.cur = -1;
    if (!ran && remaining > 0) {
      b.cur = 0;
      while (b.fibers[size_t(b.cur)].done) ++b.cur;
      fail(b, "every live thread of the block waits at a barrier that cannot complete");
    }
  }
  tlBlock = nullptr;
}

}  // namespace

const Dim& threadIdxOf() { return self().tid; }
const Dim& blockIdxOf() { return block().bid; }
const Dim& blockDimOf() { return block().bdim; }
const Dim& gridDimOf() { return block().gdim; }
int laneId() { return block().cur % 32; }
uint64_t* warpSlots() { return block().warps[size_t(block().cur / 32)].slots; }

void warpSync(Op op, unsigned mask) {
  Block& b = block();
  if (mask != 0xffffffffu) fail(b, "a warp operation with a partial mask (not emulated)");
  Warp& w = b.warps[size_t(b.cur / 32)];
  if (w.lanes != 32) fail(b, "a full-mask warp operation in a warp of fewer than 32 threads");
  if (w.arrived == 0) {
    w.op = op;
  } else if (w.op != op) {
    fail(b, "lanes of one warp meet at different warp operations (divergence)");
  }
  const uint64_t was = w.gen;
  if (++w.arrived == w.live) {
    if (w.live != 32) fail(b, "a full-mask warp operation with exited lanes");
    w.arrived = 0;
    ++w.gen;
    return;
  }
  waitFor(&w.gen, was);
}

void blockSync() {
  Block& b = block();
  const uint64_t was = b.gen;
  if (++b.arrived == b.live) {
    b.arrived = 0;
    ++b.gen;
    return;
  }
  waitFor(&b.gen, was);
}

void yieldSpin() {
  std::this_thread::yield();
  yieldToScheduler();
}

uint64_t globalTimerNs() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

void run(unsigned grid, unsigned blockThreads, const std::function<void()>& body) {
  if (grid == 0 || blockThreads == 0 || blockThreads > 1024) {
    std::fprintf(stderr, "simt: invalid launch %u x %u\n", grid, blockThreads);
    std::abort();
  }
  const Dim bdim{blockThreads, 1, 1}, gdim{grid, 1, 1};
  std::vector<std::thread> blocks;
  for (unsigned g = 0; g < grid; ++g) {
    blocks.emplace_back([&body, bdim, gdim, g]() { runBlock(Dim{g, 0, 0}, bdim, gdim, body); });
  }
  for (auto& t : blocks) t.join();
}

}  // namespace simt
}  // namespace qcomm

// ---- the CUDA runtime calls of the launch code ----

namespace {
int simtSms() {
  const char* v = std::getenv("QCOMM_SIMT_SMS");
  const int n = v != nullptr ? std::atoi(v) : 2;
  return n > 0 ? n : 2;
}
}  // namespace

extern "C" {
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  *value = attr == cudaDevAttrMultiProcessorCount ? simtSms() : 0;
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* numBlocks, const void*, int,
                                                                   size_t, unsigned int) {
  *numBlocks = 1;
  return cudaSuccess;
}
}
