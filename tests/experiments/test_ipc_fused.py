"""The fused CUDA-IPC two_step experiment (csrc/experiments/ipc_fused/; QCOMM_EXPERIMENTS=1 builds
only: tests/conftest.py ignores this folder otherwise). Run by `bash scripts/experiments_check.sh`.

On the CPU: the tiling (fused_layout.cpp); the kernel's protocol (ipc_protocol.h: task loop,
addressing, tiles, pieces, flags, epochs, sum order) executed by one host thread per rank over
host buffers with the CPU codec (fused_host.cpp), bit for bit against qcomm/reference.py; a rank
that never comes; ThreadSanitizer over that emulation (tests/experiments/native/fused_race.cpp);
and the kernel's own source under the SIMT emulator against the host emulation
(tests/experiments/native/fused_simt_main.cpp), also under ThreadSanitizer.

On a GPU (QCOMM_IPC_KERNELS=fused; skipped without one and a CUDA experiments build): the same
matrix as the separate kernels' tests (tests/cuda/test_cuda_allreduce.py, the workers of
tests/transport/ipc_cases.py), messages larger than the buffer at several launch shapes with the
profile on, streams and Work, a CUDA graph, and the set-up's agreement on the fused settings."""

import itertools
import os
import sys

import pytest
import torch
from checks import gpu, run_script

import qcomm
from qcomm import _testing
from qcomm import reference as ref

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "transport"))  # ipc_cases, for spawned ranks too
import ipc_cases as ipc  # noqa: E402

if not qcomm._C.compiled_with_experiments():  # e.g. `pytest tests/experiments` named explicitly
    pytest.skip(
        "needs a build with QCOMM_EXPERIMENTS=1 (bash scripts/experiments_check.sh)",
        allow_module_level=True,
    )

CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")
FUSED = {**ipc.ENV, "QCOMM_IPC_KERNELS": "fused"}


# ---- the tiling (CPU) ----


@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("bits", [(8, 8), (4, 4), (0, 8), (8, 0)])
@pytest.mark.parametrize("tile", [1024, 4096, 65536])
def test_ipc_geometry_covers_every_tile_within_the_buffer(world, bits, tile):
    for chunk, buffer_mb in itertools.product([128, 4096, 4096 * 7 + 128, 2**22], [1, 32]):
        g = _testing.ipc_geometry(
            chunk, bits[0], bits[1], 128, False, torch.bfloat16, world, buffer_mb << 20, tile
        )
        if g["data_offset"] + 2 * world * g["slot_bytes"] > buffer_mb << 20:
            # not one tile per rank fits: refused, naming both settings
            assert g["pieces"] == 0 and "QCOMM_IPC_TILE_ELEMS" in g["error"], g
            continue
        assert g["error"] == "", g
        assert g["tile_elems"] % 128 == 0 and g["tile_elems"] <= tile
        assert g["tiles_per_chunk"] * g["tile_elems"] >= chunk
        assert (g["tiles_per_chunk"] - 1) * g["tile_elems"] < chunk
        assert 1 <= g["piece_tiles"] <= g["max_slots"]
        assert g["pieces"] * g["piece_tiles"] >= g["tiles_per_chunk"]
        assert (g["pieces"] - 1) * g["piece_tiles"] < g["tiles_per_chunk"]
        used = g["data_offset"] + 2 * world * g["piece_tiles"] * g["slot_bytes"]
        assert used <= buffer_mb << 20
        for b in bits:
            need = (
                qcomm.codec.encoded_bytes(g["tile_elems"], b, 128, False)
                if b
                else 2 * g["tile_elems"]
            )
            assert g["slot_bytes"] >= need and g["slot_bytes"] % 16 == 0


def test_ipc_geometry_refuses_what_does_not_fit():
    g = _testing.ipc_geometry(4096, 8, 8, 128, False, torch.float32, 8, 300 * 1024)
    assert g["pieces"] == 0 and "QCOMM_IPC_BUFFER_MB" in g["error"]
    g = _testing.ipc_geometry(4096, 8, 8, 128, False, torch.float32, 9, 32 << 20)
    assert "at most 8 ranks" in g["error"]


# ---- the protocol, emulated on the host (CPU) ----


def _buffers(world, mib=32):
    return [torch.zeros(mib << 20, dtype=torch.uint8) for _ in range(world)]


def _emulate(
    xs, bufs, rs, ag, average=False, symmetric=False, stochastic=False, seq=0, blocks=1, tile=4096
):
    # the fused kernel runs unrotated two_step only (rotation is on by default at 4 bits)
    cfg = ipc.two_step(rs, ag, symmetric, stochastic).replace(rotate=False)
    outs = [x.clone() for x in xs]
    _testing.ipc_two_step_emulate(
        outs, bufs, cfg.encoded(), average, seq, blocks=blocks, tile_elems=tile
    )
    return outs


@pytest.mark.parametrize("world", [2, 3, 5, 8])
def test_ipc_protocol_emulated_matches_the_reference(world):
    bufs = _buffers(world)

    def fused(xs, rs, ag, avg, sym, sr, i):
        return _emulate(xs, bufs, rs, ag, avg, sym, sr, seq=i, blocks=1 + i % 2)

    problems = ipc.emulated_matrix(world, fused, fused=True)
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("tile", [1024, 16384])
def test_ipc_protocol_emulated_with_other_tile_sizes(tile):
    # QCOMM_IPC_TILE_ELEMS: the same results, bit for bit, whatever the tiling (a 1 MiB buffer:
    # pieces too)
    world = 3
    bufs = _buffers(world, mib=1)
    problems = []
    for i, ((rs, ag), dtype, numel) in enumerate(
        itertools.product(ipc.BITS, ipc.DTYPES, [1000, 200003])
    ):
        xs = ipc.inputs(world, numel, dtype, 50 + i)
        outs = _emulate(xs, bufs, rs, ag, average=i % 2 == 1, blocks=2, tile=tile)
        want = ref.allreduce(
            xs, "two_step_quantized_own", rs, ag, average=i % 2 == 1, rotate=False
        ).out
        problems += [
            f"rs={rs} ag={ag} {dtype} n={numel} rank {r}"
            for r, o in enumerate(outs)
            if not ipc.same_bits(o, want)
        ]
    assert not problems, "\n".join(problems[:20])


def test_ipc_protocol_emulated_pieces_epochs_noise_and_symmetric():
    # a buffer of 1 MiB: 600k elements run as several pieces, each split over three "blocks" per
    # rank; ten calls on the same buffers carry the epochs on; stochastic rounding takes the
    # call's sequence number
    world = 4
    bufs = _buffers(world, mib=1)
    g = _testing.ipc_geometry(150016, 8, 8, 128, False, torch.float32, world, 1 << 20)
    assert g["pieces"] > 1, g
    for call in range(10):
        xs = ipc.inputs(world, 600001 if call % 2 == 0 else 3001, torch.float32, 50 + call)
        sym, sr = call % 3 == 1, call % 4 == 2
        outs = _emulate(xs, bufs, 8, 8, symmetric=sym, stochastic=sr, seq=call, blocks=3)
        want = ref.allreduce(
            xs, "two_step_quantized_own", 8, 8, symmetric=sym, stochastic_seq=call if sr else None
        ).out
        assert all(ipc.same_bits(o, want) for o in outs), f"call {call} (sym={sym}, sr={sr})"
    epoch = bufs[0][:4].view(torch.int32).item()
    assert all(b[:4].view(torch.int32).item() == epoch for b in bufs) and epoch >= 10


def test_ipc_protocol_emulated_reports_a_missing_rank_instead_of_hanging():
    world = 3
    bufs = _buffers(world, mib=1)
    xs = ipc.inputs(world, 20000, torch.float32, 1)
    cfg = qcomm.QuantConfig(algorithm="two_step", min_bytes=0)
    with pytest.raises(RuntimeError, match=r"timed out in the reduce phase waiting for rank 2"):
        _testing.ipc_two_step_emulate(
            [x.clone() for x in xs], bufs, cfg.encoded(), timeout_ms=300, ranks=[0, 1]
        )
    # the abort word is set in every rank's buffer: the peers stop at once, not after a time-out
    assert all(b[64:68].view(torch.int32).item() == 1 for b in bufs)


# ---- the native checks (CPU): scripts/experiments_check.sh simt | tsan ----


def _check(step, *args, tsan=False):
    return run_script(
        "experiments_check.sh", step, *args, timeout=900, SIMT_TSAN="1" if tsan else "0"
    )


def test_ipc_protocol_has_no_data_race():
    # ThreadSanitizer over the host emulation: 4 ranks x 3 blocks as threads, several pieces and
    # calls. Weakening a flag's release store to relaxed makes it report a race on the slot bytes.
    rc, out = _check("tsan")
    assert rc == 0 and "ThreadSanitizer" not in out, out[-4000:]
    assert out.count("identical") == 4, out[-2000:]


simt_only = pytest.mark.skipif(
    not os.path.exists(os.path.join(CUDA_HOME, "include", "cuda_runtime.h")),
    reason=f"no CUDA headers under {CUDA_HOME}",
)


@simt_only
def test_fused_two_step_kernel_matches_host_emulation():
    rc, out = _check("simt")
    assert rc == 0, out[-4000:]
    assert out.count("identical to the host emulation") == 15, out[-4000:]  # 14 cases + summary
    # task groups of 1, 2 and 4 warps (QCOMM_IPC_TASK_WARPS): __syncwarp and named barriers
    for tw in (1, 2, 4):
        assert f"task_warps={tw} " in out, out[-4000:]
    assert "every present rank gave up" in out, out[-4000:]
    assert "simt:" not in out, out[-4000:]


@simt_only
def test_fused_two_step_kernel_has_no_data_race():
    # W ranks x B blocks x 256 threads, every CUDA thread a TSan fiber: a race between threads of
    # one block (a missing __syncwarp or __syncthreads) or between ranks (a flag that does not
    # order a slot) fails it. Removing either __syncwarp of DeviceExec::sumEncode makes it report
    # one, as does removing the __syncwarp or the named barrier of a task group of one or two
    # warps (DeviceExec::barrier).
    rc, out = _check("simt", "--quick", tsan=True)
    assert rc == 0 and "ThreadSanitizer" not in out, out[-4000:]
    assert out.count("identical to the host emulation") == 8, out[-4000:]  # 7 cases + summary
    assert "task_warps=1 " in out and "task_warps=2 " in out, out[-4000:]


# ---- the GPU (QCOMM_IPC_KERNELS=fused) ----


@gpu
@pytest.mark.parametrize("world", [2, 4])
def test_fused_two_step_matches_the_reference(world):
    ipc.assert_no_problems(ipc.matrix_worker, world, timeout=400, env=FUSED)


@gpu
# tiles (QCOMM_IPC_TILE_ELEMS) and task groups (QCOMM_IPC_TASK_WARPS: 8 is one group per block,
# the default; 1 and 2 take __syncwarp and named barriers): the same bits whatever the shape
@pytest.mark.parametrize(
    ("tile", "task_warps"), [("4096", "8"), ("16384", "8"), ("4096", "1"), ("16384", "2")]
)
def test_fused_message_larger_than_the_buffer_runs_in_pieces(tile, task_warps):
    env = {
        **FUSED,
        "QCOMM_IPC_BUFFER_MB": "1",
        "QCOMM_IPC_PROFILE": "1",
        "QCOMM_IPC_TILE_ELEMS": tile,
        "QCOMM_IPC_TASK_WARPS": task_warps,
    }
    ipc.assert_no_problems(ipc.pieces_worker, 2, timeout=300, env=env)


@gpu
def test_fused_streams_work_and_errors():
    ipc.assert_no_problems(ipc.semantics_worker, 2, timeout=300, env=FUSED)


@gpu
def test_fused_two_step_in_a_cuda_graph_replays_with_changing_inputs():
    ipc.assert_no_problems(ipc.graph_worker, 2, 100, timeout=400, env=FUSED)


@gpu
def test_fused_setup_agrees_on_settings_or_fails_on_every_rank():
    # the tiling and the kernels, different on two ranks: IPC is refused on every rank, naming
    # the setting
    ipc.assert_settings_differ_refused("QCOMM_IPC_TILE_ELEMS", ("4096", "8192"))
    ipc.assert_settings_differ_refused("QCOMM_IPC_KERNELS", ("fused", "separate"))
    # an invalid setting on one rank: it raises a ValueError naming it, the other raises too (both
    # read at the group's CUDA set-up, csrc/backend/call_cuda.cpp ipcSettings)
    for name, value in [("QCOMM_IPC_TILE_ELEMS", "3000"), ("QCOMM_IPC_TASK_WARPS", "3")]:
        ipc.assert_invalid_setting_refused(name, value)
