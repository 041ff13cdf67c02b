"""Quantized allreduce of CUDA tensors over the CUDA-IPC transport (the fused two_step kernel, and
the separate kernels of QCOMM_IPC_KERNELS=separate), and both protocols emulated on the CPU.

Ranks are processes that share one GPU (NCCL refuses two ranks on one GPU; CUDA IPC does not):
world sizes 2 and 4 on cuda:0. Every result must equal qcomm/reference.py bit for bit (so every
rank holds the same bits, and the CPU path's), lie within the codec's bound of the exact sum, and
land in place. Processes that share a GPU run by time-slicing, so nothing here is timed.

On CPU (every run, CI included): the IPC layout arithmetic (csrc/ipc_layout.cpp), and the fused
kernel's protocol (csrc/ipc_protocol.h: task loop, addressing, tiles, pieces, flags, epochs, sum
order) executed by one host thread per rank over host buffers with the CPU codec
(csrc/ipc_host.cpp), bit for bit against the reference; and the separate kernels' byte exchange
(csrc/ipc_exchange.h) under the collective path's two_step with the CPU codec, the same way. The
GPU tests skip without a GPU and the CUDA build.
"""

import itertools
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from checks import gpu

import qcomm
from qcomm import reference as ref

from dist_util import run_ranks

# the quantized CUDA path is opt-in (README, "CUDA tensors")
ENV = {"QCOMM_CUDA_QUANTIZE": "1", "QCOMM_IPC_SPIN_TIMEOUT_MS": "20000"}

BITS = [(8, 8), (4, 8), (4, 4), (None, 8), (8, None)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


# ---- the layout (CPU) ----


@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("bits", [(8, 8), (4, 4), (0, 8), (8, 0)])
@pytest.mark.parametrize("tile", [1024, 4096, 65536])
def test_ipc_geometry_covers_every_tile_within_the_buffer(world, bits, tile):
    for chunk, buffer_mb in itertools.product([128, 4096, 4096 * 7 + 128, 2**22], [1, 32]):
        g = qcomm._C.ipc_geometry(
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
                qcomm._C.encoded_bytes(g["tile_elems"], b, 128, False) if b else 2 * g["tile_elems"]
            )
            assert g["slot_bytes"] >= need and g["slot_bytes"] % 16 == 0


def test_ipc_geometry_refuses_what_does_not_fit():
    g = qcomm._C.ipc_geometry(4096, 8, 8, 128, False, torch.float32, 8, 300 * 1024)
    assert g["pieces"] == 0 and "QCOMM_IPC_BUFFER_MB" in g["error"]
    g = qcomm._C.ipc_geometry(4096, 8, 8, 128, False, torch.float32, 9, 32 << 20)
    assert "at most 8 ranks" in g["error"]


# ---- the protocol, emulated on the host (CPU) ----


def _two_step(rs, ag, symmetric=False, stochastic=False):
    return qcomm.QuantConfig(
        algorithm="two_step",
        rs_bits=rs,
        ag_bits=ag,
        min_bytes=0,
        symmetric=symmetric,
        stochastic_rounding=stochastic,
    )


def _assert_no_problems(worker, world, *args, timeout, env):
    """Run `worker` on `world` ranks; each returns a list of problems; none may have any."""
    problems = run_ranks(worker, world, *args, timeout=timeout, env=env)
    flat = sorted(set(p for ps in problems for p in ps))
    assert not flat, "\n".join(flat[:30])


def _buffers(world, mib=32):
    return [torch.zeros(mib << 20, dtype=torch.uint8) for _ in range(world)]


def _emulate(
    xs, bufs, rs, ag, average=False, symmetric=False, stochastic=False, seq=0, blocks=1, tile=4096
):
    cfg = _two_step(rs, ag, symmetric, stochastic)
    outs = [x.clone() for x in xs]
    qcomm._C.ipc_two_step_emulate(
        outs, bufs, cfg.as_tuple(), average, seq, blocks=blocks, tile_elems=tile
    )
    return outs


EMULATED_CASES = list(itertools.product(BITS, DTYPES, [1, 7, 1000, 65539]))


def _emulated_matrix(world, emulate):
    """Every bit pair, dtype and size of EMULATED_CASES (AVG, symmetric scales and stochastic
    rounding in some) through emulate(xs, rs, ag, avg, sym, sr, i), bit for bit against the
    reference on every rank; the problems found."""
    problems = []
    for i, ((rs, ag), dtype, numel) in enumerate(EMULATED_CASES):
        xs = _inputs(world, numel, dtype, i)
        avg, sym, sr = i % 3 == 0, i % 5 == 1, i % 7 == 2
        outs = emulate(xs, rs, ag, avg, sym, sr, i)
        want = ref.allreduce(
            xs, "two_step", rs, ag, average=avg, symmetric=sym, stochastic_seq=i if sr else None
        ).out
        for r, o in enumerate(outs):
            if not _same_bits(o, want):
                problems.append(
                    f"rs={rs} ag={ag} {dtype} n={numel} avg={avg} sym={sym} sr={sr} rank {r}: "
                    f"{int((o != want).sum())} elements differ"
                )
    return problems


@pytest.mark.parametrize("world", [2, 3, 5, 8])
def test_ipc_protocol_emulated_matches_the_reference(world):
    bufs = _buffers(world)

    def fused(xs, rs, ag, avg, sym, sr, i):
        return _emulate(xs, bufs, rs, ag, avg, sym, sr, seq=i, blocks=1 + i % 2)

    problems = _emulated_matrix(world, fused)
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("tile", [1024, 16384])
def test_ipc_protocol_emulated_with_other_tile_sizes(tile):
    # QCOMM_IPC_TILE_ELEMS: the same results, bit for bit, whatever the tiling (a 1 MiB buffer:
    # pieces too)
    world = 3
    bufs = _buffers(world, mib=1)
    problems = []
    for i, ((rs, ag), dtype, numel) in enumerate(itertools.product(BITS, DTYPES, [1000, 200003])):
        xs = _inputs(world, numel, dtype, 50 + i)
        outs = _emulate(xs, bufs, rs, ag, average=i % 2 == 1, blocks=2, tile=tile)
        want = ref.allreduce(xs, "two_step", rs, ag, average=i % 2 == 1).out
        problems += [
            f"rs={rs} ag={ag} {dtype} n={numel} rank {r}"
            for r, o in enumerate(outs)
            if not _same_bits(o, want)
        ]
    assert not problems, "\n".join(problems[:20])


def test_ipc_protocol_emulated_pieces_epochs_noise_and_symmetric():
    # a buffer of 1 MiB: 600k elements run as several pieces, each split over three "blocks" per
    # rank; ten calls on the same buffers carry the epochs on; stochastic rounding takes the
    # call's sequence number
    world = 4
    bufs = _buffers(world, mib=1)
    g = qcomm._C.ipc_geometry(150016, 8, 8, 128, False, torch.float32, world, 1 << 20)
    assert g["pieces"] > 1, g
    for call in range(10):
        xs = _inputs(world, 600001 if call % 2 == 0 else 3001, torch.float32, 50 + call)
        sym, sr = call % 3 == 1, call % 4 == 2
        outs = _emulate(xs, bufs, 8, 8, symmetric=sym, stochastic=sr, seq=call, blocks=3)
        want = ref.allreduce(
            xs, "two_step", 8, 8, symmetric=sym, stochastic_seq=call if sr else None
        ).out
        assert all(_same_bits(o, want) for o in outs), f"call {call} (sym={sym}, sr={sr})"
    epoch = bufs[0][:4].view(torch.int32).item()
    assert all(b[:4].view(torch.int32).item() == epoch for b in bufs) and epoch >= 10


def test_ipc_protocol_emulated_reports_a_missing_rank_instead_of_hanging():
    world = 3
    bufs = _buffers(world, mib=1)
    xs = _inputs(world, 20000, torch.float32, 1)
    cfg = qcomm.QuantConfig(algorithm="two_step", min_bytes=0)
    with pytest.raises(RuntimeError, match=r"timed out in the reduce phase waiting for rank 2"):
        qcomm._C.ipc_two_step_emulate(
            [x.clone() for x in xs], bufs, cfg.as_tuple(), timeout_ms=300, ranks=[0, 1]
        )
    # the abort word is set in every rank's buffer: the peers stop at once, not after a time-out
    assert all(b[64:68].view(torch.int32).item() == 1 for b in bufs)


# ---- the separate kernels (QCOMM_IPC_KERNELS=separate), emulated on the host (CPU) ----


@pytest.mark.parametrize("world", [2, 3, 8])
def test_ipc_exchange_geometry_fits_the_buffer(world):
    for mib_bytes in [kib << 10 for kib in (257, 300, 1024, 32 << 10)]:
        g = qcomm._C.ipc_exchange_geometry(world, mib_bytes)
        assert g["error"] == "", g
        assert g["round_bytes"] % 16 == 0 and g["round_bytes"] >= 16
        assert world * g["round_bytes"] <= g["half_bytes"]
        assert g["data_offset"] + 2 * g["half_bytes"] <= mib_bytes
        # the rounds use the buffer: less than one more part per rank would fit
        assert world * (g["round_bytes"] + 16) > g["half_bytes"]
    g = qcomm._C.ipc_exchange_geometry(world, 256 << 10)  # only the flags fit
    assert g["round_bytes"] == 0 and "QCOMM_IPC_BUFFER_MB" in g["error"], g
    assert "at most 8 ranks" in qcomm._C.ipc_exchange_geometry(9, 32 << 20)["error"]


def _emulate_separate(xs, bufs, rs, ag, average=False, symmetric=False, stochastic=False, seq=0):
    cfg = _two_step(rs, ag, symmetric, stochastic)
    outs = [x.clone() for x in xs]
    qcomm._C.ipc_separate_emulate(outs, bufs, cfg.as_tuple(), average, seq)
    return outs


@pytest.mark.parametrize("world", [2, 3, 5, 8])
def test_ipc_separate_kernels_emulated_match_the_reference(world):
    # the collective path's two_step (the CPU codec standing in for the CUDA kernels, which are
    # bit-identical to it) with its bytes moved through host buffers by ipc_exchange.h's schedule,
    # one thread per rank. A 300 KiB buffer: the larger messages take several rounds per exchange.
    bufs = [torch.zeros(300 << 10, dtype=torch.uint8) for _ in range(world)]

    def separate(xs, rs, ag, avg, sym, sr, i):
        return _emulate_separate(xs, bufs, rs, ag, avg, sym, sr, seq=i)

    problems = _emulated_matrix(world, separate)
    assert not problems, "\n".join(problems[:20])
    # every rank entered the same barriers: one per call, then one per round of each exchange
    # (more than 3 per call on average: some exchanges took several rounds)
    counts = [b[160:164].view(torch.int32).item() for b in bufs]
    assert len(set(counts)) == 1 and counts[0] > 3 * len(EMULATED_CASES), counts


def test_ipc_separate_kernels_emulated_report_a_missing_rank_instead_of_hanging():
    world = 3
    bufs = [torch.zeros(1 << 20, dtype=torch.uint8) for _ in range(world)]
    xs = _inputs(world, 20000, torch.float32, 1)
    cfg = qcomm.QuantConfig(algorithm="two_step", min_bytes=0)
    with pytest.raises(
        RuntimeError,
        match=r"rank \d timed out in the separate kernels' barrier 0 of its call "
        r"waiting for rank 2",
    ):
        qcomm._C.ipc_separate_emulate(
            [x.clone() for x in xs], bufs, cfg.as_tuple(), timeout_ms=300, ranks=[0, 1]
        )
    # the abort word is set in every rank's buffer: the peers stop at once, not after a time-out
    assert all(b[64:68].view(torch.int32).item() == 1 for b in bufs)


def _transport_worker(rank, world):
    x = torch.ones(1 << 20)
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0))
    dist.all_reduce(x)  # a CPU allreduce chooses no CUDA transport
    return {**qcomm.cuda_transport(), "profile": qcomm.cuda_ipc_profile()}


def test_cuda_transport_is_unchosen_until_a_cuda_allreduce():
    got = run_ranks(_transport_worker, 2, timeout=120)
    assert [g["transport"] for g in got] == ["", ""], got
    assert [g["kernels"] for g in got] == ["", ""], got
    assert [g["profile"] for g in got] == [{}, {}], got
    if not qcomm.compiled_with_cuda():
        assert all("without CUDA" in g["note"] for g in got), got


def test_ipc_protocol_has_no_data_race():
    # ThreadSanitizer over the emulations: 4 ranks x 3 blocks as threads, several pieces and calls.
    # Weakening a flag's release store to relaxed makes it report a race on the slot bytes.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run(
        ["bash", os.path.join(root, "scripts", "tsan_ipc.sh")],
        capture_output=True,
        text=True,
        timeout=600,
        # not under another sanitizer's preloaded runtime (scripts/sanitize.sh sets LD_PRELOAD)
        env={
            **{k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},
            "PYTHON": sys.executable,
        },
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "ThreadSanitizer" not in out, out[-4000:]
    assert out.count("identical") == 4, out[-2000:]
    # the separate kernels' exchange: the same harness, slots of several rounds (copied out) and
    # of one (read where they landed); using one half for every round, a barrier that does not
    # wait, or no barrier before a slot of one round is read, makes TSan report a race
    assert out.count("every byte delivered") == 6, out[-2000:]


# ---- the GPU ----


def _inputs(world, numel, dtype, seed):
    xs = []
    for r in range(world):
        g = torch.Generator().manual_seed(seed * 1000 + r)
        xs.append(torch.randn(numel, generator=g).to(dtype))
    return xs


def _same_bits(a, b):
    na, nb = torch.isnan(a), torch.isnan(b)
    return torch.equal(na, nb) and torch.equal(a[~na], b[~nb])


def _case(
    rank,
    world,
    rs,
    ag,
    dtype,
    numel,
    seed,
    average=False,
    symmetric=False,
    stochastic=False,
    async_op=False,
):
    cfg = _two_step(rs, ag, symmetric, stochastic)
    qcomm.set_config(cfg)
    xs = _inputs(world, numel, dtype, seed)
    x = xs[rank].cuda()
    seq = qcomm.stats()["next_call_seq"]
    op = dist.ReduceOp.AVG if average else dist.ReduceOp.SUM
    work = dist.all_reduce(x, op=op, async_op=async_op)
    if async_op:
        work.wait()  # the current stream waits; the host does not
    got = x.cpu()
    name = (
        f"rs={rs} ag={ag} {dtype} n={numel} avg={average} sym={symmetric} "
        f"sr={stochastic} async={async_op}"
    )
    r = ref.allreduce(
        xs,
        "two_step",
        rs,
        ag,
        symmetric=symmetric,
        average=average,
        stochastic_seq=seq if stochastic else None,
    )
    problems = []
    if not _same_bits(got, r.out):
        diff = (got.double() - r.out.double()).abs().max().item()
        bad = int((got != r.out).sum())
        problems.append(f"{name}: differs from the reference at {bad} elements (max {diff})")
    elif not bool(((got.double() - r.exact).abs() <= r.bound).all()):
        problems.append(f"{name}: outside the codec's bound")
    return problems


def _matrix_worker(rank, world):
    torch.cuda.set_device(0)
    problems = []
    i = 0
    for (rs, ag), dtype, numel in itertools.product(BITS, DTYPES, [1, 7, 1000, 65539]):
        i += 1
        problems += _case(rank, world, rs, ag, dtype, numel, i)
    chosen = qcomm.cuda_transport()
    if chosen["transport"] != "ipc" or chosen["kernels"] != os.environ.get(
        "QCOMM_IPC_KERNELS", "separate"
    ):
        problems.append(f"transport is {chosen}")
    # AVG, symmetric, stochastic rounding, async on the side stream, a large message
    problems += _case(rank, world, 8, 8, torch.float32, 4099, 101, average=True)
    problems += _case(rank, world, 4, 8, torch.bfloat16, 5000, 102, symmetric=True)
    problems += _case(rank, world, 4, 4, torch.float32, 9000, 103, stochastic=True)
    problems += _case(rank, world, 8, 8, torch.bfloat16, 3 * 2**20 + 5, 104, async_op=True)
    problems += _case(rank, world, 4, 8, torch.float16, 2**22, 105, average=True)
    return problems


@gpu
@pytest.mark.parametrize("world", [2, 4])
# QCOMM_IPC_KERNELS=separate: the NCCL transport's codec kernels, the bytes copied through the IPC
# buffers between barrier kernels (csrc/ipc_exchange.h); the same matrix, the same bits
@pytest.mark.parametrize("kernels", ["fused", "separate"])
def test_ipc_two_step_matches_the_reference(world, kernels):
    env = {**ENV, "QCOMM_IPC_KERNELS": kernels}
    _assert_no_problems(_matrix_worker, world, timeout=400, env=env)


def _pieces_worker(rank, world):
    # a 1 MiB buffer: a 4M-element message runs as many pieces of the fused kernel, and epochs
    # advance per piece (or, with the separate kernels, each exchange takes many rounds)
    torch.cuda.set_device(0)
    problems = []
    for seed, (dtype, numel) in enumerate([(torch.float32, 2**22 + 77), (torch.bfloat16, 300001)]):
        problems += _case(rank, world, 8, 8, dtype, numel, 300 + seed)
        problems += _case(rank, world, 4, 8, dtype, numel, 400 + seed, average=True)
    if os.environ.get("QCOMM_IPC_PROFILE") == "1":
        # profiled: the results above are unchanged, and every phase of the fused kernel counted
        torch.cuda.synchronize()
        prof = qcomm.cuda_ipc_profile()
        if prof.get("runs", 0) <= 0 or any(v <= 0 for v in prof.values()):
            problems.append(f"profile: {prof}")
    return problems


@gpu
# tiles (QCOMM_IPC_TILE_ELEMS) and task groups (QCOMM_IPC_TASK_WARPS: 8 is one group per block,
# the default; 1 and 2 take __syncwarp and named barriers): the same bits whatever the shape
@pytest.mark.parametrize(
    ("tile", "task_warps"), [("4096", "8"), ("16384", "8"), ("4096", "1"), ("16384", "2")]
)
def test_ipc_message_larger_than_the_buffer_runs_in_pieces(tile, task_warps):
    env = {
        **ENV,
        "QCOMM_IPC_KERNELS": "fused",  # the launch shapes and the profile are the fused kernel's
        "QCOMM_IPC_BUFFER_MB": "1",
        "QCOMM_IPC_PROFILE": "1",
        "QCOMM_IPC_TILE_ELEMS": tile,
        "QCOMM_IPC_TASK_WARPS": task_warps,
    }
    _assert_no_problems(_pieces_worker, 2, timeout=300, env=env)


@gpu
def test_ipc_separate_kernels_exchange_in_rounds():
    env = {**ENV, "QCOMM_IPC_KERNELS": "separate", "QCOMM_IPC_BUFFER_MB": "1"}
    _assert_no_problems(_pieces_worker, 2, timeout=300, env=env)


def _semantics_worker(rank, world):
    torch.cuda.set_device(0)
    problems = []
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0))
    xs = _inputs(world, 64 * 64, torch.float32, 7)
    want = ref.allreduce([x.view(64, 64).t().contiguous().flatten() for x in xs]).out
    # in place on a non-contiguous view, async: Work, future and stream order
    m = xs[rank].cuda().view(64, 64)
    view = m.t()
    work = dist.all_reduce(view, async_op=True)
    fut = work.get_future()
    work.wait()
    after = (view * 1).contiguous().flatten().cpu()  # enqueued after wait(): must see the result
    if not torch.equal(after, want.view(64, 64).flatten()):
        problems.append("async non-contiguous: wrong result after wait()")
    if not torch.equal(fut.wait()[0].contiguous().flatten().cpu(), want.view(64, 64).flatten()):
        problems.append("the future's value is not the result")
    torch.cuda.synchronize()
    if not work.is_completed():
        problems.append("work not completed after synchronize")
    # a rank whose call differs: both raise, naming the field, and the group stays usable
    x = torch.ones(1000 + rank, device="cuda")
    try:
        dist.all_reduce(x)
        problems.append("a numel mismatch did not raise")
    except RuntimeError as e:
        if "numel" not in str(e):
            problems.append(f"mismatch error does not name numel: {e}")
    problems += _case(rank, world, 8, 8, torch.float32, 1000, 9)
    # without the opt-in a CUDA allreduce is NCCL's (qcomm.plan says why; read per call)
    os.environ.pop("QCOMM_CUDA_QUANTIZE")
    p = qcomm.plan(torch.ones(1 << 20, device="cuda"))
    if p["quantize"] or "QCOMM_CUDA_QUANTIZE" not in p["reason"]:
        problems.append(f"plan without the opt-in: {p}")
    os.environ["QCOMM_CUDA_QUANTIZE"] = "1"
    return problems


@gpu
@pytest.mark.parametrize("kernels", ["fused", "separate"])
def test_ipc_streams_work_and_errors(kernels):
    _assert_no_problems(
        _semantics_worker, 2, timeout=300, env={**ENV, "QCOMM_IPC_KERNELS": kernels}
    )


def _ordering_worker(rank, world):
    # IPC calls share the group's buffers and device epoch, so they must not overlap, whatever
    # streams their callers are on: an async call still outstanding while a sync call runs, and
    # sync calls issued under two different streams, all give the reference's bits.
    torch.cuda.set_device(0)
    qcomm.set_config(_two_step(8, 8))
    problems = []
    n = 300001
    ins = [_inputs(world, n, torch.float32, 600 + i) for i in range(4)]
    want = [ref.allreduce(xs, "two_step", 8, 8).out for xs in ins]
    a, b = ins[0][rank].cuda(), ins[1][rank].cuda()
    work = dist.all_reduce(a, async_op=True)
    dist.all_reduce(b)
    work.wait()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    c, d = ins[2][rank].cuda(), ins[3][rank].cuda()
    torch.cuda.synchronize()
    with torch.cuda.stream(s1):
        dist.all_reduce(c)
    with torch.cuda.stream(s2):
        dist.all_reduce(d)
    torch.cuda.synchronize()
    for name, got, w in zip(["async", "sync", "stream 1", "stream 2"], [a, b, c, d], want):
        if not _same_bits(got.cpu(), w):
            problems.append(f"{name}: differs from the reference")
    return problems


@gpu
def test_ipc_calls_on_different_streams_do_not_overlap():
    _assert_no_problems(_ordering_worker, 2, timeout=300, env=ENV)


def _setup_worker(rank, world, settings):
    # per-rank transport settings, read at the group's first quantized CUDA allreduce; returns
    # what each rank raised (or "" when nothing) and the transport it reports
    torch.cuda.set_device(0)
    for k, v in settings[rank].items():
        os.environ[k] = v
    qcomm.set_config(_two_step(8, 8))
    x = torch.ones(4096, device="cuda")
    raised = ""
    try:
        dist.all_reduce(x)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 (what each rank raised is the result)
        raised = f"{type(e).__name__}: {e}"
    return {"raised": raised, **qcomm.cuda_transport()}


@gpu
def test_ipc_setup_agrees_on_settings_or_fails_on_every_rank():
    # settings the tiling depends on, different on two ranks: IPC is refused on every rank,
    # naming the setting
    for name, values in [
        ("QCOMM_IPC_BUFFER_MB", ("1", "2")),
        ("QCOMM_IPC_TILE_ELEMS", ("4096", "8192")),
        ("QCOMM_IPC_KERNELS", ("fused", "separate")),
    ]:
        got = run_ranks(_setup_worker, 2, [{name: v} for v in values], timeout=180, env=ENV)
        for g in got:
            assert g["transport"] == "nccl" and f"{name} differs" in g["note"], got
            # then NCCL runs it, and NCCL refuses two ranks on one GPU: that, or nothing, is raised
            assert not g["raised"] or "nccl" in g["raised"].lower(), got
    # IPC required on one rank and impossible: every rank raises (no rank waits for the other)
    got = run_ranks(
        _setup_worker,
        2,
        [{"QCOMM_TRANSPORT": "ipc", "QCOMM_IPC_BUFFER_MB": "1"}, {"QCOMM_IPC_BUFFER_MB": "2"}],
        timeout=180,
        env=ENV,
    )
    for g in got:
        assert "QCOMM_TRANSPORT=ipc on rank 0" in g["raised"], got
    # an invalid setting on one rank: it raises a ValueError naming it, the other raises too
    for name, value in [
        ("QCOMM_IPC_BUFFER_MB", "lots"),
        ("QCOMM_IPC_TILE_ELEMS", "3000"),
        ("QCOMM_IPC_TASK_WARPS", "3"),
        ("QCOMM_IPC_KERNELS", "both"),
    ]:
        got = run_ranks(_setup_worker, 2, [{}, {name: value}], timeout=180, env=ENV)
        assert "ValueError" in got[1]["raised"] and name in got[1]["raised"], got
        assert "rank 1 has an invalid" in got[0]["raised"], got


def _graph_worker(rank, world, replays):
    torch.cuda.set_device(0)
    cfg = qcomm.QuantConfig(rs_bits=8, ag_bits=8, min_bytes=0)
    qcomm.set_config(cfg)
    numel = 10007
    static = torch.zeros(numel, device="cuda")
    dist.all_reduce(static)  # warm-up: sets up the transport outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(static)
    problems = []
    for i in range(replays):
        xs = _inputs(world, numel, torch.float32, 1000 + i)
        static.copy_(xs[rank].cuda())
        graph.replay()
        got = static.cpu()
        want = ref.allreduce(xs).out
        if not torch.equal(got, want):
            problems.append(
                f"replay {i}: differs from the reference at {int((got != want).sum())} elements"
            )
            break
    # the group still runs eager calls after the replays (the epochs stayed in step)
    problems += _case(rank, world, 8, 8, torch.float32, 5000, 77)
    return problems


@gpu
@pytest.mark.parametrize("kernels", ["fused", "separate"])
def test_ipc_two_step_in_a_cuda_graph_replays_with_changing_inputs(kernels):
    env = {**ENV, "QCOMM_IPC_KERNELS": kernels}
    _assert_no_problems(_graph_worker, 2, 100, timeout=400, env=env)
