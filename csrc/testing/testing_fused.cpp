// qcomm._testing's hooks of the fused CUDA-IPC two_step experiment
// (csrc/experiments/ipc_fused/; builds with QCOMM_EXPERIMENTS=1 only): ipc_two_step_emulate, its
// protocol run on host memory, and ipc_geometry, its tiling. Not a public API.
#ifdef QCOMM_EXPERIMENTS

#include <pybind11/stl.h>
#include <torch/extension.h>

#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "common/torch_dtype.h"
#include "experiments/ipc_fused/fused_host.h"
#include "experiments/ipc_fused/fused_layout.h"
#include "plan/config.h"
#include "plan/plan.h"
#include "testing/emulation.h"

namespace py = pybind11;

namespace qcomm {
namespace {

// The fused CUDA-IPC two_step's protocol run on host memory, one thread per rank of `ranks`
// (default all; each as `blocks` threads, as the kernel's blocks), in place on `inputs` (one
// CPU tensor per rank) over `buffers` (one zeroed byte tensor per rank, kept by the caller
// across calls so epochs carry on).
std::vector<at::Tensor> ipcEmulate(std::vector<at::Tensor> inputs, std::vector<at::Tensor> buffers,
                                   py::object cfg, bool average, uint32_t callSeq,
                                   int64_t timeoutMs, std::vector<int> ranks, int blocks,
                                   int64_t tileElems) {
  const int world = int(inputs.size());
  const Plan plan = emulatedPlan("ipc_two_step_emulate", inputs, buffers, cfg, average, callSeq);
  std::string why;
  const IpcGeometry g =
      ipcGeometry(plan.chunkElems, plan.rs, plan.ag, world, buffers[0].numel(), &why, tileElems);
  TORCH_CHECK_VALUE(why.empty(), "ipc_two_step_emulate: ", why);
  if (ranks.empty()) {
    for (int r = 0; r < world; ++r) ranks.push_back(r);
  }
  for (int r : ranks) {
    TORCH_CHECK_VALUE(r >= 0 && r < world, "ipc_two_step_emulate: no rank ", r);
  }
  IpcError error{};
  std::vector<IpcTwoStepArgs> args(ranks.size());
  std::vector<uint8_t*> bufferPtrs;
  for (auto& b : buffers) bufferPtrs.push_back(b.data_ptr<uint8_t>());
  {
    py::gil_scoped_release noGil;
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ranks.size(); ++i) {
      const int r = ranks[i];
      IpcTwoStepArgs& a = args[i];
      a = ipcArgs(plan, r, g, inputs[r].data_ptr(), bufferPtrs.data(), timeoutMs * 1000000, &error);
      threads.emplace_back([&a, blocks]() { ipcTwoStepEmulate(a, blocks); });
    }
    for (auto& t : threads) t.join();
  }
  TORCH_CHECK(error.code == 0, rankPrefix(int(error.rank), world), describeIpcError(error));
  return inputs;
}

}  // namespace

void registerFusedTesting(py::module& m) {
  m.def("ipc_two_step_emulate", &ipcEmulate, py::arg("inputs"), py::arg("buffers"),
        py::arg("config"), py::arg("average") = false, py::arg("call_seq") = 0,
        py::arg("timeout_ms") = 60000, py::arg("ranks") = std::vector<int>{}, py::arg("blocks") = 1,
        py::arg("tile_elems") = kIpcTileElems);
  m.def(
      "ipc_geometry",
      [](int64_t chunkElems, int rsBits, int agBits, int groupSize, bool symmetric,
         at::ScalarType dtype, int world, int64_t bufferBytes, int64_t tileElems) {
        const int32_t raw = dtypeCode(dtype);
        std::string why;
        const IpcGeometry g =
            ipcGeometry(chunkElems, CodecSpec{rsBits, groupSize, symmetric ? 1 : 0, raw},
                        CodecSpec{agBits, groupSize, symmetric ? 1 : 0, raw}, world, bufferBytes,
                        &why, tileElems);
        py::dict d;
        d["tile_elems"] = g.tileElems;
        d["slot_bytes"] = g.slotBytes;
        d["tiles_per_chunk"] = g.tilesPerChunk;
        d["piece_tiles"] = g.pieceTiles;
        d["pieces"] = g.pieces;
        d["data_offset"] = kIpcDataOffset;
        d["max_slots"] = kIpcMaxSlots;
        d["error"] = why;
        return d;
      },
      py::arg("chunk_elems"), py::arg("rs_bits"), py::arg("ag_bits"), py::arg("group_size"),
      py::arg("symmetric"), py::arg("dtype"), py::arg("world"), py::arg("buffer_bytes"),
      py::arg("tile_elems") = kIpcTileElems);
}

}  // namespace qcomm

#endif  // QCOMM_EXPERIMENTS
