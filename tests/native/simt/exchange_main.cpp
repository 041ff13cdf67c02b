// The separate kernels over CUDA IPC (csrc/cuda/ipc_kernels.cu: the copy kernel and the one-thread
// barrier kernel), run by the SIMT emulator with W ranks as host threads over shared host buffers,
// under the exchange's schedule (csrc/transport/ipc_exchange.h, tests/native/exchange_check.h):
// every byte where it belongs over several calls, slots of several rounds (copied out) and of one
// (read where they landed), slots that are not whole 16-byte vectors (both of the copy kernel's
// paths). Then a rank that never comes: the others' barrier kernels must give up within the
// bound and record why (step 3); and ranks whose calls differ (plan fingerprints): every rank's
// first barrier gives up and the end check fills their messages with 0xFF. Exits non-zero on any
// difference, a missing error record, or an emulator error. Run by scripts/simt_check.sh exchange.
#include <cstdio>
#include <thread>
#include <vector>

#include "../exchange_check.h"
#include "cuda/ipc_kernels.h"
#include "cuda/ipc_layout.h"

using namespace qcomm;

namespace {

// The separate kernels' executor the transport runs (gpu::ExchangeKernels), here run by the
// emulator, copy kernels of at most 3 blocks.
struct KernelCopies : gpu::ExchangeKernels {
  explicit KernelCopies(const IpcPeers& p) : gpu::ExchangeKernels{p, nullptr, 3} {}
};

void readPart(KernelCopies& c, uint8_t* into, const uint8_t* part, int64_t bytes) {
  c.copy(into, part, bytes);  // the copy kernel, as a decode kernel would read it
  c.flush();
}

bool runExchange() {
  const int W = 3;
  if (!exchangeCalls<KernelCopies>("exchange kernels", W, 2048, {5000, 10008, 16, 4096, 2000})) {
    return false;
  }
  const IpcExchangeGeometry g = ipcExchangeGeometry(W, kIpcDataOffset + 2 * W * 2048, nullptr);
  std::vector<std::vector<uint8_t>> bufs(
      size_t(W), std::vector<uint8_t>(size_t(kIpcDataOffset + 2 * g.halfBytes), 0));
  std::vector<IpcError> err(static_cast<size_t>(W));
  // rank W-1 never comes
  const int64_t timeoutNs = 300 * 1000000LL;
  std::vector<std::thread> ranks;
  for (int r = 0; r + 1 < W; ++r) {
    ranks.emplace_back([&, r]() {
      IpcPeers p{};
      p.world = W;
      p.rank = r;
      for (int q = 0; q < W; ++q) p.buffers[q] = bufs[size_t(q)].data();
      p.timeoutNs = timeoutNs;
      p.hostError = &err[size_t(r)];
      KernelCopies c{p};
      ipc::CopySchedule<KernelCopies> x(c, g, c.peers.buffers, r, W);
      x.begin();
    });
  }
  for (auto& t : ranks) t.join();
  bool timedOutOnMissing = false;
  for (int r = 0; r + 1 < W; ++r) {
    const IpcError& e = err[size_t(r)];
    if (e.code == 0 || e.step != 3u || e.rank != uint32_t(r)) {
      std::fprintf(stderr, "exchange, missing rank: rank %d recorded code %u step %u\n", r, e.code,
                   e.step);
      return false;
    }
    timedOutOnMissing = timedOutOnMissing || (e.code == 1 && e.peer == uint32_t(W - 1));
    std::printf("exchange kernels, missing rank: rank %d: %s\n", r, describeIpcError(e).c_str());
  }
  return timedOutOnMissing;
}

// Ranks whose calls differ: rank 1's plan fingerprint is not the others'. Every rank's first
// barrier must give up (code 3 where it compared with a differing peer, 2 where a peer's abort
// word stopped it first), at least one with code 3 naming both fingerprints, and the end check
// (ipcPoisonIfAborted) must then fill each rank's message with 0xFF; on buffers where nothing gave
// up it must leave the message as it was.
bool runMismatch() {
  const int W = 3;
  const IpcExchangeGeometry g = ipcExchangeGeometry(W, kIpcDataOffset + 2 * W * 2048, nullptr);
  std::vector<std::vector<uint8_t>> bufs(
      size_t(W), std::vector<uint8_t>(size_t(kIpcDataOffset + 2 * g.halfBytes), 0));
  std::vector<std::vector<uint8_t>> data(size_t(W), std::vector<uint8_t>(1000, 7));
  std::vector<IpcError> err(static_cast<size_t>(W));
  auto peersOf = [&](int r) {
    IpcPeers p{};
    p.world = W;
    p.rank = r;
    for (int q = 0; q < W; ++q) p.buffers[q] = bufs[size_t(q)].data();
    p.timeoutNs = 20 * 1000000000LL;  // a mismatch must not wait for it
    p.hostError = &err[size_t(r)];
    return p;
  };
  // nothing gave up yet: the end check writes nothing
  gpu::ipcPoisonIfAborted(peersOf(0), data[0].data(), int64_t(data[0].size()), nullptr);
  if (data[0][0] != 7 || data[0][999] != 7) {
    std::fprintf(stderr, "exchange, mismatch: the end check wrote where nothing gave up\n");
    return false;
  }
  const uint32_t prints[W] = {0x1234abcdu, 0x0badf00du, 0x1234abcdu};
  std::vector<std::thread> ranks;
  for (int r = 0; r < W; ++r) {
    ranks.emplace_back([&, r]() {
      KernelCopies c{peersOf(r)};
      ipc::CopySchedule<KernelCopies> x(c, g, c.peers.buffers, r, W, prints[r]);
      x.begin();
      gpu::ipcPoisonIfAborted(c.peers, data[size_t(r)].data(), int64_t(data[size_t(r)].size()),
                              nullptr);
    });
  }
  for (auto& t : ranks) t.join();
  bool named = false;
  for (int r = 0; r < W; ++r) {
    const IpcError& e = err[size_t(r)];
    if ((e.code != 3 && e.code != 2) || e.step != 3u || e.rank != uint32_t(r)) {
      std::fprintf(stderr, "exchange, mismatch: rank %d recorded code %u step %u\n", r, e.code,
                   e.step);
      return false;
    }
    for (uint8_t v : data[size_t(r)]) {
      if (v != 0xFF) {
        std::fprintf(stderr, "exchange, mismatch: rank %d's message was not filled\n", r);
        return false;
      }
    }
    if (e.code == 3) {
      named = named || (e.peer < uint32_t(W) && e.epoch == prints[r] && e.tile == prints[e.peer] &&
                        prints[e.peer] != prints[r]);
    }
    std::printf("exchange kernels, mismatch: rank %d: %s\n", r, describeIpcError(e).c_str());
  }
  if (!named) std::fprintf(stderr, "exchange, mismatch: no record names both fingerprints\n");
  return named;
}

}  // namespace

int main() {
  if (!runExchange()) return 1;
  if (!runMismatch()) return 1;
  std::printf("separate kernels' exchange: every byte delivered\n");
  return 0;
}
