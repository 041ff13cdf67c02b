// The host executor of the fused two_step's protocol (see ipc_host.h and ipc_protocol.h).
#include "python/ipc_emulation.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "codec/codec_cpu.h"
#include "cuda/ipc_protocol.h"

namespace qcomm {
namespace {

uint32_t loadAcquire(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

void storeRelease(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }

std::atomic<int64_t> prefetchMisses{0};

// One rank, one "block": every task of the piece in order; the CPU codec on whole tiles.
struct HostExec {
  const IpcTwoStepArgs& a;
  bool giveUp = false;
  std::vector<float> sum;
  // The protocol names, before each encode of its input, the input tile it encodes next
  // (prefetchInput; the kernel prefetches it). Here the encode after that one must encode
  // exactly the tile named (len <= 0: none named); a miss is counted (ipcEmulatedPrefetchMisses).
  ipc::Tile named{0, 0};     // by the latest prefetchInput
  ipc::Tile expected{0, 0};  // by the one before the latest encode

  uint32_t epochBase() const { return loadAcquire(ipc::word(a.buffers[a.rank], kIpcEpochOffset)); }
  void barrier() const {}
  void mark(int) const {}
  bool leader() const { return true; }
  void setGiveUp() { giveUp = true; }
  bool gaveUp() const { return giveUp; }
  void release(uint32_t* flag, uint32_t v) const { storeRelease(flag, v); }

  void recordError(uint32_t code, uint32_t step, int peer, int64_t tile, uint32_t epoch) const {
    uint32_t none = 0;
    if (__atomic_compare_exchange_n(&a.hostError->code, &none, code, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      a.hostError->step = step;
      a.hostError->peer = uint32_t(peer);
      a.hostError->tile = uint32_t(tile);
      a.hostError->epoch = epoch;
      a.hostError->rank = uint32_t(a.rank);
    }
  }

  bool wait(const uint32_t* flag, uint32_t epoch, uint32_t step, int peer, int64_t tile) const {
    const uint32_t* abortWord = ipc::word(a.buffers[a.rank], kIpcAbortOffset);
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      if (loadAcquire(flag) == epoch) return true;
      if (loadAcquire(abortWord) != 0u) {
        recordError(2u, step, peer, tile, epoch);
        return false;
      }
      const auto waited = std::chrono::steady_clock::now() - start;
      if (std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count() > a.timeoutNs) {
        recordError(1u, step, peer, tile, epoch);
        for (int r = 0; r < a.world; ++r) {
          storeRelease(ipc::word(a.buffers[r], kIpcAbortOffset), 1u);
        }
        return false;
      }
      std::this_thread::yield();
    }
  }

  const void* at(int64_t begin) const {
    return static_cast<const uint8_t*>(a.data) + begin * dtypeBytes(a.dtype);
  }

  void prefetchInput(ipc::Tile tile) { named = tile; }

  // a tile named that no encode followed is a miss too (at the piece's end)
  void endPiece() {
    if (expected.len > 0 || named.len > 0) ++prefetchMisses;
    expected = named = {0, 0};
  }

  void encodeReduce(ipc::Tile tile, uint8_t* dst) {
    if (expected.len > 0 && (expected.begin != tile.begin || expected.len != tile.len)) {
      ++prefetchMisses;
    }
    expected = named;
    named = {0, 0};
    encodeBlock(at(tile.begin), a.dtype, tile.len, a.rs, dst,
                Noise{a.rsNoise.salt, tile.begin, a.rsNoise.on});
  }

  void sumEncode(ipc::Tile tile, int64_t s, uint8_t* out) {
    sum.resize(size_t(tile.len));
    for (int q = 0; q < a.world; ++q) {
      decodeBlock(ipc::reduceSlot(a.buffers[a.rank], a.geometry, q, s), tile.len, a.rs, sum.data(),
                  /*accumulate=*/q > 0);
    }
    if (a.average) {
      for (float& v : sum) v = v / float(a.world);
    }
    encodeBlock(sum.data(), kFloat32, tile.len, a.ag, out,
                Noise{a.agNoise.salt, tile.begin, a.agNoise.on});
  }

  void copy16(uint8_t* dst, const uint8_t* src, int64_t vectors) const {
    std::memcpy(dst, src, size_t(vectors) * 16);
  }

  void decodeOut(const uint8_t* src, ipc::Tile tile) {
    sum.resize(size_t(tile.len));
    decodeBlock(src, tile.len, a.ag, sum.data(), false);
    castFromFloat(sum.data(), tile.len, a.dtype,
                  static_cast<uint8_t*>(a.data) + tile.begin * dtypeBytes(a.dtype));
  }
};

}  // namespace

int64_t ipcEmulatedPrefetchMisses() { return prefetchMisses.load(); }

bool ipcBarrierEmulate(const IpcTwoStepArgs& a, uint32_t index) {
  HostExec ex{a};
  return ipc::barrier(ex, a.buffers, a.rank, a.world, index);
}

bool ipcTwoStepEmulate(const IpcTwoStepArgs& a, int blocks) {
  blocks = blocks < 1 ? 1 : blocks;
  for (int64_t p = 0; p < a.geometry.pieces; ++p) {
    std::vector<char> ok(size_t(blocks), 1);
    std::vector<std::thread> threads;
    for (int b = 1; b < blocks; ++b) {
      threads.emplace_back([&, b]() {
        HostExec ex{a};
        ok[size_t(b)] = ipc::runPiece(ex, a, p, b, blocks);
        if (ok[size_t(b)]) ex.endPiece();
      });
    }
    HostExec ex{a};
    ok[0] = ipc::runPiece(ex, a, p, 0, blocks);
    if (ok[0]) ex.endPiece();
    for (auto& t : threads) t.join();
    for (char o : ok) {
      if (!o) return false;
    }
  }
  uint32_t* epoch = ipc::word(a.buffers[a.rank], kIpcEpochOffset);
  storeRelease(epoch, loadAcquire(epoch) + uint32_t(a.geometry.pieces));
  return true;
}

}  // namespace qcomm
