// The host executor of the fused two_step's protocol (fused_host.h, ipc_protocol.h).
#include "experiments/ipc_fused/fused_host.h"

#include <cstring>
#include <thread>
#include <vector>

#include "codec/codec_cpu.h"
#include "cuda/ipc_host_sync.h"
#include "experiments/ipc_fused/ipc_protocol.h"

namespace qcomm {
namespace {

// One rank, one "block": every task of the piece in order; the CPU codec on whole tiles. Its
// waits are the host spin of csrc/cuda/ipc_host_sync.h, which gives up as the kernel's does.
struct HostExec {
  const IpcTwoStepArgs& a;
  bool giveUp = false;
  std::vector<float> sum;

  uint32_t epochBase() const {
    return ipc::hostLoadAcquire(ipc::word(a.buffers[a.rank], kIpcEpochOffset));
  }
  void barrier() const {}
  void mark(int) const {}
  bool leader() const { return true; }
  void setGiveUp() { giveUp = true; }
  bool gaveUp() const { return giveUp; }
  void release(uint32_t* flag, uint32_t v) const { ipc::hostStoreRelease(flag, v); }
  bool wait(const uint32_t* flag, uint32_t epoch, uint32_t step, int peer, int64_t tile) const {
    return ipc::hostSpinWait(a, flag, epoch, step, peer, tile);
  }

  const void* at(int64_t begin) const {
    return static_cast<const uint8_t*>(a.data) + begin * dtypeBytes(a.dtype);
  }

  void encodeReduce(ipc::Tile tile, uint8_t* dst) {
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

bool ipcTwoStepEmulate(const IpcTwoStepArgs& a, int blocks) {
  blocks = blocks < 1 ? 1 : blocks;
  for (int64_t p = 0; p < a.geometry.pieces; ++p) {
    std::vector<char> ok(size_t(blocks), 1);
    std::vector<std::thread> threads;
    for (int b = 1; b < blocks; ++b) {
      threads.emplace_back([&, b]() {
        HostExec ex{a};
        ok[size_t(b)] = ipc::runPiece(ex, a, p, b, blocks);
      });
    }
    HostExec ex{a};
    ok[0] = ipc::runPiece(ex, a, p, 0, blocks);
    for (auto& t : threads) t.join();
    for (char o : ok) {
      if (!o) return false;
    }
  }
  uint32_t* epoch = ipc::word(a.buffers[a.rank], kIpcEpochOffset);
  ipc::hostStoreRelease(epoch, ipc::hostLoadAcquire(epoch) + uint32_t(a.geometry.pieces));
  return true;
}

}  // namespace qcomm
