// The SIMT emulator's runtime (see simt.h): blocks on OS threads, CUDA threads as fibers, the
// synchronising operations as cooperative barriers, and the few CUDA runtime calls the kernels'
// launch code makes, answered as a small device would (kSimtSms = 2 multiprocessors, one resident
// block each, so grid-stride loops take several turns).
#include "simt.h"

#include <sched.h>
#include <ucontext.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#if defined(QCOMM_SIMT_TSAN)
// This file is built without instrumentation (its bookkeeping is not the kernels' memory); it
// tells ThreadSanitizer about fibers and about the orderings barriers create.
extern "C" {
void* __tsan_get_current_fiber(void);
void* __tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void* fiber);
void __tsan_switch_to_fiber(void* fiber, unsigned flags);
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
}
#endif

namespace qcomm {
namespace simt {
namespace {

constexpr size_t kStackBytes = 128 << 10;

// ThreadSanitizer's view: `sync` switches carry ordering (a fiber's start and end only), every
// other switch carries none; barriers release into and acquire from a per-generation address.
void* tsanCurrent() {
#if defined(QCOMM_SIMT_TSAN)
  return __tsan_get_current_fiber();
#else
  return nullptr;
#endif
}
void* tsanCreate() {
#if defined(QCOMM_SIMT_TSAN)
  return __tsan_create_fiber(0);
#else
  return nullptr;
#endif
}
void tsanDestroy(void* f) {
#if defined(QCOMM_SIMT_TSAN)
  if (f != nullptr) __tsan_destroy_fiber(f);
#else
  (void)f;
#endif
}
void tsanSwitch(void* to, bool sync) {
#if defined(QCOMM_SIMT_TSAN)
  __tsan_switch_to_fiber(to, sync ? 0u : 1u /* __tsan_switch_to_fiber_no_sync */);
#else
  (void)to;
  (void)sync;
#endif
}
void tsanRelease(void* addr) {
#if defined(QCOMM_SIMT_TSAN)
  __tsan_release(addr);
#else
  (void)addr;
#endif
}
void tsanAcquire(void* addr) {
#if defined(QCOMM_SIMT_TSAN)
  __tsan_acquire(addr);
#else
  (void)addr;
#endif
}

// One cp.async: done when its thread waits for its group (see simt.h).
struct AsyncCopy {
  void* dst;
  const void* src;
  int bytes;
};

struct alignas(16) SharedLine {
  uint8_t bytes[16];
};

struct Fiber {
  ucontext_t ctx;
  std::vector<AsyncCopy> openCopies;             // issued since the last commit
  std::deque<std::vector<AsyncCopy>> committed;  // groups not yet waited for, oldest first
  Dim tid{0, 0, 0};
  bool done = false;
  const uint64_t* waitGen = nullptr;  // while waiting at a barrier: its generation counter
  uint64_t waitVal = 0;               // and the value it had on arrival
  std::unique_ptr<char[]> stack;
  void* tsan = nullptr;
};

struct Warp {
  int lanes = 0;  // threads of the block in this warp
  int live = 0;   // of them not exited
  int arrived = 0;
  uint64_t gen = 0;
  Op op = Op::kSyncWarp;
  uint64_t slots[32] = {};
  char order[2];  // ThreadSanitizer sync addresses of even and odd generations
};

// A named barrier (bar.sync id, count): its arrivals since it last released, and its count.
struct Named {
  int arrived = 0;
  int threads = 0;
  uint64_t gen = 0;
  char order[2];
};
constexpr int kNamedBarriers = 16;  // ids 1..15 (0 is __syncthreads)

struct Block {
  Dim bid, bdim, gdim;
  Named named[kNamedBarriers];
  const std::function<void()>* body = nullptr;
  std::unique_ptr<SharedLine[]> shared;  // dynamic shared memory
  size_t sharedBytes = 0;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  int live = 0;
  int arrived = 0;
  uint64_t gen = 0;
  ucontext_t sched;
  void* tsanSched = nullptr;
  int cur = -1;
  char order[2];
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
  tsanSwitch(b.tsanSched, false);
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
  yieldToScheduler();  // started (with the launch's ordering); run once every fiber is
  (*b.body)();
  Fiber& f = b.fibers[size_t(b.cur)];
  bool copiesLeft = !f.openCopies.empty();
  for (const auto& g : f.committed) copiesLeft |= !g.empty();
  if (copiesLeft) fail(b, "a thread exited with asynchronous copies it never waited for");
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
  tsanSwitch(b.tsanSched, true);  // the block's end (and the launch's join) follows this fiber
  // returning resumes the scheduler (uc_link)
}

void runBlock(Dim bid, Dim bdim, Dim gdim, const std::function<void()>& body, size_t shared) {
  Block b;
  b.bid = bid;
  b.bdim = bdim;
  b.gdim = gdim;
  b.body = &body;
  if (shared > 0) {
    const size_t lines = (shared + 15) / 16;
    b.shared.reset(new SharedLine[lines]);
    std::memset(b.shared.get(), 0xff, lines * 16);
    b.sharedBytes = shared;
  }
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
  b.tsanSched = tsanCurrent();
  for (int i = 0; i < n; ++i) {
    Fiber& f = b.fibers[size_t(i)];
    f.tid = Dim{unsigned(i), 0, 0};
    f.stack.reset(new char[kStackBytes]);
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.get();
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = &b.sched;
    makecontext(&f.ctx, fiberMain, 0);
    f.tsan = tsanCreate();
  }
  for (int i = 0; i < n; ++i) {  // start every fiber, ordered after the launch, before any runs
    Fiber& f = b.fibers[size_t(i)];
    b.cur = i;
    tsanSwitch(f.tsan, true);
    swapcontext(&b.sched, &f.ctx);
  }
  int remaining = n;
  while (remaining > 0) {
    bool ran = false;
    for (int i = 0; i < n; ++i) {
      Fiber& f = b.fibers[size_t(i)];
      if (f.done || (f.waitGen != nullptr && *f.waitGen == f.waitVal)) continue;
      ran = true;
      b.cur = i;
      tsanSwitch(f.tsan, false);
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
  for (Fiber& f : b.fibers) tsanDestroy(f.tsan);
  tlBlock = nullptr;
}

}  // namespace

const Dim& threadIdxOf() { return self().tid; }
const Dim& blockIdxOf() { return block().bid; }
const Dim& blockDimOf() { return block().bdim; }
const Dim& gridDimOf() { return block().gdim; }

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
  const bool orders = op == Op::kSyncWarp;  // shuffles and ballots order no memory
  if (orders) tsanRelease(&w.order[was & 1]);
  if (++w.arrived == w.live) {
    if (w.live != 32) fail(b, "a full-mask warp operation with exited lanes");
    w.arrived = 0;
    ++w.gen;
  } else {
    waitFor(&w.gen, was);
  }
  if (orders) tsanAcquire(&w.order[was & 1]);
}

uint64_t shuffleWord(unsigned mask, uint64_t v, int src, bool isXor) {
  Block& b = block();
  Warp& w = b.warps[size_t(b.cur / 32)];
  const int lane = b.cur % 32;
  w.slots[lane] = v;
  warpSync(Op::kShuffle, mask);
  const uint64_t r = w.slots[(isXor ? lane ^ src : src) & 31];
  warpSync(Op::kShuffle, mask);  // nobody overwrites a slot before every lane has read
  return r;
}

unsigned ballot(unsigned mask, int pred) {
  Block& b = block();
  Warp& w = b.warps[size_t(b.cur / 32)];
  w.slots[b.cur % 32] = pred != 0;
  warpSync(Op::kBallot, mask);
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r |= unsigned(w.slots[l] != 0) << l;
  warpSync(Op::kBallot, mask);
  return r;
}

namespace {

// Arrive at a barrier that `expected` arrivals release: the last one advances `gen`, the others
// wait for that; ThreadSanitizer sees a release into and an acquire from the generation's address.
void arrive(int& arrived, int expected, uint64_t& gen, char (&order)[2]) {
  const uint64_t was = gen;
  tsanRelease(&order[was & 1]);
  if (++arrived == expected) {
    arrived = 0;
    ++gen;
  } else {
    waitFor(&gen, was);
  }
  tsanAcquire(&order[was & 1]);
}

}  // namespace

void blockSync() {
  Block& b = block();
  arrive(b.arrived, b.live, b.gen, b.order);
}

void namedBarrier(int id, int threads) {
  Block& b = block();
  if (id < 1 || id >= kNamedBarriers) fail(b, "a named barrier id outside 1..15");
  if (threads <= 0 || threads % 32 != 0 || threads > int(b.bdim.x)) {
    fail(b, "a named barrier's thread count is not a whole number of the block's warps");
  }
  Named& n = b.named[id];
  if (n.arrived == 0) {
    n.threads = threads;
  } else if (n.threads != threads) {
    fail(b, "threads meet at one named barrier with different counts");
  }
  arrive(n.arrived, n.threads, n.gen, n.order);
}

void yieldSpin() {
  std::this_thread::yield();
  yieldToScheduler();
}

uint8_t* dynamicShared() {
  Block& b = block();
  if (b.sharedBytes == 0) fail(b, "dynamic shared memory used by a launch that gave none");
  return reinterpret_cast<uint8_t*>(b.shared.get());
}

void copyAsync(void* dst, const void* src, int bytes) {
  Block& b = block();
  const auto d = reinterpret_cast<uintptr_t>(dst);
  const auto base = reinterpret_cast<uintptr_t>(b.shared.get());
  if (bytes != 4 && bytes != 8 && bytes != 16) fail(b, "cp.async of other than 4, 8 or 16 bytes");
  if (d % uintptr_t(bytes) != 0 || reinterpret_cast<uintptr_t>(src) % uintptr_t(bytes) != 0) {
    fail(b, "cp.async with a misaligned address");
  }
  if (b.sharedBytes == 0 || d < base || d + uintptr_t(bytes) > base + b.sharedBytes) {
    fail(b, "cp.async to outside the block's dynamic shared memory");
  }
  std::memset(dst, 0xff, size_t(bytes));  // undetermined until the wait
  self().openCopies.push_back(AsyncCopy{dst, src, bytes});
}

void copyAsyncCommit() {
  Fiber& f = self();
  f.committed.push_back(std::move(f.openCopies));
  f.openCopies.clear();
}

void copyAsyncWait(int pending) {
  Fiber& f = self();
  while (f.committed.size() > size_t(pending < 0 ? 0 : pending)) {
    for (const AsyncCopy& c : f.committed.front()) std::memcpy(c.dst, c.src, size_t(c.bytes));
    f.committed.pop_front();
  }
}

uint64_t globalTimerNs() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

void run(unsigned grid, unsigned blockThreads, const std::function<void()>& body, size_t shared) {
  if (grid == 0 || blockThreads == 0 || blockThreads > 1024) {
    std::fprintf(stderr, "simt: invalid launch %u x %u\n", grid, blockThreads);
    std::abort();
  }
  const Dim bdim{blockThreads, 1, 1}, gdim{grid, 1, 1};
  std::vector<std::thread> blocks;
  for (unsigned g = 0; g < grid; ++g) {
    blocks.emplace_back(
        [&body, bdim, gdim, g, shared]() { runBlock(Dim{g, 0, 0}, bdim, gdim, body, shared); });
  }
  for (auto& t : blocks) t.join();
}

}  // namespace simt
}  // namespace qcomm

// ---- the CUDA runtime calls of the launch code ----

namespace {
constexpr int kSimtSms = 2;  // the emulated device's multiprocessors
}  // namespace

extern "C" {
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
// the separate kernels' executor names a failed launch (csrc/cuda/ipc_kernels.h, failure())
const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "a CUDA error (SIMT emulator)";
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  *value = attr == cudaDevAttrMultiProcessorCount ? kSimtSms : 0;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) { return cudaSuccess; }
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* numBlocks, const void*, int,
                                                                   size_t, unsigned int) {
  *numBlocks = 1;
  return cudaSuccess;
}
}
