"""The CUDA-IPC transport's exchange (csrc/transport/ipc_exchange.h, the separate kernels of
QCOMM_IPC_KERNELS=separate) on the CPU, every run: its geometry (csrc/cuda/ipc_layout.cpp); the
collective path's two_step, ring and semi_ring with the CPU codec (bit-identical to the CUDA
kernels) with their bytes moved through host buffers by the exchange's copy schedule and the
barrier of csrc/cuda/ipc_barrier.h, one thread per rank (csrc/testing/ipc_emulation.*), bit for bit
against qcomm/reference.py; a rank that never comes; and ThreadSanitizer over the same exchange,
its all-to-all, all-gather and ring legs (scripts/tsan_ipc.sh). The kernels themselves run under
the SIMT emulator in tests/cuda/test_simt_emulation.py and on a GPU in
tests/cuda/test_cuda_allreduce.py. The rings over CUDA IPC are verified only this way, on the CPU
(and their copy kernels under the SIMT emulator); they have not run on a GPU."""

import itertools
import os
import re
import subprocess
import sys
import time

import pytest
import torch
from ipc_cases import EMULATED_CASES, emulated_matrix, inputs, same_bits, two_step

import qcomm
from qcomm import _testing
from qcomm import reference as ref

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("world", [2, 3, 8])
def test_ipc_exchange_geometry_fits_the_buffer(world):
    for mib_bytes in [kib << 10 for kib in (257, 300, 1024, 32 << 10)]:
        g = _testing.ipc_exchange_geometry(world, mib_bytes)
        assert g["error"] == "", g
        assert g["round_bytes"] % 16 == 0 and g["round_bytes"] >= 16
        assert world * g["round_bytes"] <= g["half_bytes"]
        assert g["data_offset"] + 2 * g["half_bytes"] <= mib_bytes
        # the rounds use the buffer: less than one more part per rank would fit
        assert world * (g["round_bytes"] + 16) > g["half_bytes"]
    g = _testing.ipc_exchange_geometry(world, 256 << 10)  # only the flags fit
    assert g["round_bytes"] == 0 and "QCOMM_IPC_BUFFER_MB" in g["error"], g
    assert "at most 8 ranks" in _testing.ipc_exchange_geometry(9, 32 << 20)["error"]


def _emulate_separate(xs, bufs, rs, ag, average=False, symmetric=False, stochastic=False, seq=0):
    cfg = two_step(rs, ag, symmetric, stochastic)
    outs = [x.clone() for x in xs]
    _testing.ipc_separate_emulate(outs, bufs, cfg.encoded(), average, seq)
    return outs


@pytest.mark.parametrize("world", [2, 3, 5, 8])
def test_ipc_separate_kernels_emulated_match_the_reference(world):
    # the collective path's two_step (the CPU codec standing in for the CUDA kernels, which are
    # bit-identical to it) with its bytes moved through host buffers by ipc_exchange.h's schedule,
    # one thread per rank. A 300 KiB buffer: the larger messages take several rounds per exchange.
    bufs = [torch.zeros(300 << 10, dtype=torch.uint8) for _ in range(world)]

    def separate(xs, rs, ag, avg, sym, sr, i):
        return _emulate_separate(xs, bufs, rs, ag, avg, sym, sr, seq=i)

    problems = emulated_matrix(world, separate)
    assert not problems, "\n".join(problems[:20])
    # every rank entered the same barriers: one per call, then one per round of each exchange
    # (more than 3 per call on average: some exchanges took several rounds)
    counts = [b[160:164].view(torch.int32).item() for b in bufs]
    assert len(set(counts)) == 1 and counts[0] > 3 * len(EMULATED_CASES), counts


@pytest.mark.parametrize("world", [2, 3])
def test_ipc_separate_kernels_emulated_rotate_as_the_reference(world):
    # rotate=True: the schedule rotates through CodecOps (the CPU codec standing in for the CUDA
    # kernels' rotated codec, bit-identical to it under the SIMT emulator); numels that end inside
    # a group run on copies padded with zeros to whole groups, as the backend's
    bufs = [torch.zeros(300 << 10, dtype=torch.uint8) for _ in range(world)]
    problems = []
    cases = [
        (8, 8, torch.float32, 1000, False, False),
        (4, 4, torch.bfloat16, 65539, True, False),
        (4, 8, torch.float32, 4096, False, True),
        (None, 8, torch.bfloat16, 7, False, False),
        (8, None, torch.float32, 300, True, True),
    ]
    for i, (rs, ag, dtype, n, avg, sr) in enumerate(cases):
        cfg = two_step(rs, ag, stochastic=sr).replace(rotate=True)
        xs = inputs(world, n, dtype, 70 + i)
        outs = [x.clone() for x in xs]
        _testing.ipc_separate_emulate(outs, bufs, cfg.encoded(), avg, i)
        want = ref.allreduce(
            xs, "two_step", rs, ag, average=avg, rotate=True, stochastic_seq=i if sr else None
        ).out
        for r, y in enumerate(outs):
            if not torch.equal(y.view(torch.uint8), want.view(torch.uint8)):
                problems.append(f"rotated {rs}/{ag} {dtype} n={n} avg={avg} sr={sr}: rank {r}")
    assert not problems, "\n".join(problems)


RING_BITS = [(8, 8), (4, 8), (8, None), (4, 4)]
RING_SIZES = [1, 7, 1000, 65539]  # 65539: a prime, in several rounds per hop with 300 KiB buffers
RING_CASES = list(
    itertools.product(RING_BITS, [torch.float32, torch.bfloat16], RING_SIZES, [False, True])
)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("algorithm", ["ring", "semi_ring"])
def test_ipc_separate_kernels_emulated_rings_match_the_reference(algorithm, world):
    # the rings' hops are point-to-point legs: each runs as rounds through the buffers (one per
    # hop where a unit fits a round, read where it landed; else copied out). A 300 KiB buffer
    # (rounds of 2.7 KiB with 8 ranks, 11 KiB with 2): a chunk of the 65539-element messages takes
    # several rounds per hop, one of 1000 elements a single round, and with 1 or 7 elements most
    # ranks' legs carry no bytes but take part. AVG and SUM for each rotation; stochastic rounding
    # in some.
    bufs = [torch.zeros(300 << 10, dtype=torch.uint8) for _ in range(world)]
    problems = []
    for i, ((rs, ag), dtype, n, rotate) in enumerate(RING_CASES):
        for avg in (False, True):
            seq = 2 * i + avg
            sr = seq % 7 == 2
            cfg = qcomm.QuantConfig(
                algorithm=algorithm,
                rs_bits=rs,
                ag_bits=ag,
                min_bytes=0,
                rotate=rotate,
                stochastic_rounding=sr,
            )
            xs = inputs(world, n, dtype, 90 + seq)
            outs = [x.clone() for x in xs]
            _testing.ipc_separate_emulate(outs, bufs, cfg.encoded(), avg, seq)
            want = ref.allreduce(
                xs,
                algorithm,
                rs,
                ag,
                average=avg,
                rotate=rotate,
                stochastic_seq=seq if sr else None,
            ).out
            for r, o in enumerate(outs):
                if not same_bits(o, want):
                    problems.append(
                        f"{algorithm} rs={rs} ag={ag} {dtype} n={n} rotate={rotate} avg={avg} "
                        f"sr={sr} rank {r}: {int((o != want).sum())} elements differ"
                    )
    assert not problems, "\n".join(problems[:20])
    # every rank entered the same barriers: one per call, then one per round of each hop and of
    # the gather exchange; more than one round each on average (some took several)
    counts = [b[160:164].view(torch.int32).item() for b in bufs]
    hops = world - 1 if algorithm == "ring" else world // 2
    assert len(set(counts)) == 1 and counts[0] > (2 + hops) * 2 * len(RING_CASES), counts


# reduce-scatter (the reduce half of each algorithm: SUM, AVG, PREMUL_SUM) and all-gather (the
# gather phase alone) over the exchange: shards of one element, a group and one, and several
# rounds of a 300 KiB buffer
SHARDED_SHARDS = [1, 129, 30001]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ipc_separate_kernels_emulated_sharded_calls_match_the_reference(world):
    bufs = [torch.zeros(300 << 10, dtype=torch.uint8) for _ in range(world)]
    problems = []
    seq = 0
    for algorithm, dtype, shard in itertools.product(
        ["two_step", "ring", "semi_ring"], [torch.float32, torch.bfloat16], SHARDED_SHARDS
    ):
        seq += 1
        op, factor = [("sum", None), ("avg", None), ("premul", 1 / 3)][seq % 3]
        bits = 4 if seq % 2 else 8
        sr = seq % 5 == 1
        cfg = qcomm.QuantConfig(
            algorithm=algorithm,
            rs_bits=bits,
            ag_bits=12 - bits,
            min_bytes=0,
            rotate=False,
            stochastic_rounding=sr,
            reduce_scatter=True,
            all_gather=True,
        )
        name = f"{algorithm} {dtype} shard={shard}"
        xs = inputs(world, shard * world, dtype, 300 + seq)
        before = [x.clone() for x in xs]
        outs = _testing.ipc_sharded_emulate(xs, bufs, cfg.encoded(), 1, op, factor or 1.0, seq)
        want = ref.reduce_scatter(
            xs, algorithm, bits, op=op, factor=factor, stochastic_seq=seq if sr else None,
            rotate=False,
        )  # fmt: skip
        for r, o in enumerate(outs):
            if not same_bits(o, want[r].out):
                problems.append(f"reduce-scatter {name} {op} rs={bits} sr={sr} rank {r} differs")
        if not all(torch.equal(a, b) for a, b in zip(xs, before)):
            problems.append(f"reduce-scatter {name}: an input was written")
        if algorithm != "two_step":
            continue  # the gather phase is the same whatever the config's algorithm
        shards = [x[:shard].clone() for x in xs]
        outs = _testing.ipc_sharded_emulate(shards, bufs, cfg.encoded(), 2, "sum", 1.0, seq)
        want = ref.all_gather(shards, 12 - bits, rotate=False).out
        for r, o in enumerate(outs):
            if not same_bits(o, want):
                problems.append(f"all-gather {name} ag={12 - bits} rank {r} differs")
    assert not problems, "\n".join(problems[:20])
    # every rank entered the same barriers
    counts = [b[160:164].view(torch.int32).item() for b in bufs]
    assert len(set(counts)) == 1 and counts[0] > 0, counts


@pytest.mark.parametrize("algorithm", ["two_step", "ring"])
def test_ipc_separate_kernels_emulated_report_a_missing_rank_instead_of_hanging(algorithm):
    world = 3
    bufs = [torch.zeros(1 << 20, dtype=torch.uint8) for _ in range(world)]
    xs = inputs(world, 20000, torch.float32, 1)
    cfg = qcomm.QuantConfig(algorithm=algorithm, min_bytes=0)
    with pytest.raises(
        RuntimeError,
        match=r"rank \d timed out in the separate kernels' barrier 0 of its call "
        r"waiting for rank 2",
    ):
        _testing.ipc_separate_emulate(
            [x.clone() for x in xs], bufs, cfg.encoded(), timeout_ms=300, ranks=[0, 1]
        )
    # the abort word is set in every rank's buffer: the peers stop at once, not after a time-out
    assert all(b[64:68].view(torch.int32).item() == 1 for b in bufs)


def test_ipc_separate_kernels_emulated_stop_at_once_when_a_rank_abandons_its_call():
    # issue 37, defect 5: rank 2 fails before its call's launches (an allocation, a device check)
    # while ranks 0 and 1 wait for it in the call's first barrier. It takes the abort path
    # (IpcTransport::abandon, emulated on the host buffers: the same abort words): the peers stop
    # at once with "a peer gave up", far below the 20 s bound they would otherwise spin to (and
    # then report a time-out), their outputs NaN; rank 2's output is untouched (nothing ran)
    world, timeout_ms = 3, 20000
    bufs = [torch.zeros(1 << 20, dtype=torch.uint8) for _ in range(world)]
    xs = inputs(world, 20000, torch.float32, 11)
    outs = [x.clone() for x in xs]
    cfg = qcomm.QuantConfig(algorithm="two_step", min_bytes=0)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as e:
        _testing.ipc_separate_emulate(outs, bufs, cfg.encoded(), timeout_ms=timeout_ms, abandon=[2])
    took = time.monotonic() - t0
    msg = str(e.value)
    assert re.search(
        r"rank [01] stopped because a peer gave up \(separate kernels' barrier 0 ", msg
    ), msg
    assert "(3 of 3 ranks stopped)" in msg, msg
    assert took < timeout_ms / 1000 / 10, took
    for r in (0, 1):
        assert torch.isnan(outs[r]).all(), r
    assert torch.equal(outs[2], xs[2])
    assert all(b[64:68].view(torch.int32).item() != 0 for b in bufs)


@pytest.mark.parametrize("algorithm", ["two_step", "ring", "semi_ring"])
def test_ipc_separate_kernels_emulated_refuse_a_mismatched_call_on_every_rank(algorithm):
    # no header exchange on the host: the call's first barrier compares the ranks' plan
    # fingerprints. A call that differs on one rank (numel, dtype, bits, or its call number: a
    # rank that made one quantized call more) stops every rank there, at once (not at the
    # time-out), and leaves NaN in every rank's output, not numbers
    world = 3
    cfg = qcomm.QuantConfig(algorithm=algorithm, min_bytes=0)
    other_bits = qcomm.QuantConfig(algorithm=algorithm, min_bytes=0, rs_bits=4, ag_bits=4)
    cases = {
        "numel": dict(numels=[20000, 20001, 20000]),
        "dtype": dict(dtypes=[torch.float32, torch.float32, torch.bfloat16]),
        "bits": dict(rank_configs=[other_bits.encoded()] + [cfg.encoded()] * 2),
        "call number": dict(rank_seqs=[5, 5, 6]),
    }
    for what, case in cases.items():
        bufs = [torch.zeros(1 << 20, dtype=torch.uint8) for _ in range(world)]
        numels = case.get("numels", [20000] * world)
        dtypes = case.get("dtypes", [torch.float32] * world)
        outs = [inputs(1, n, dt, 3 + r)[0].clone() for r, (n, dt) in enumerate(zip(numels, dtypes))]
        t0 = time.monotonic()
        with pytest.raises(RuntimeError) as e:
            _testing.ipc_separate_emulate(
                outs,
                bufs,
                cfg.encoded(),
                call_seq=5,
                timeout_ms=60000,
                rank_seqs=case.get("rank_seqs", []),
                rank_configs=case.get("rank_configs", []),
            )
        took = time.monotonic() - t0
        msg = str(e.value)
        assert "the ranks disagree on this call" in msg and "plan fingerprint" in msg, (what, msg)
        assert "QCOMM_DEBUG=CHECK" in msg and "(3 of 3 ranks stopped)" in msg, (what, msg)
        assert took < 30, (what, took)  # far below the 60 s bound: nobody waited for it
        for r, o in enumerate(outs):
            assert torch.isnan(o).all(), (what, r)
        # the abort word stays set: the next call on these buffers stops too (the backend refuses
        # it before that, naming this error)
        with pytest.raises(RuntimeError, match="a peer gave up|disagree"):
            _testing.ipc_separate_emulate(
                [inputs(1, 100, torch.float32, 9)[0] for _ in range(world)], bufs, cfg.encoded()
            )


def test_ipc_exchange_has_no_data_race():
    # ThreadSanitizer over the exchange's host emulation: 4 ranks as threads, slots of several
    # rounds (copied out) and of one (read where they landed), several calls, each an all-to-all,
    # an all-gather and a ring step's legs in both directions (semi_ring's). Using one half for
    # every round, a barrier that does not wait, or no barrier before a slot of one round is read,
    # makes TSan report a race.
    run = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "tsan_ipc.sh")],
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
    assert out.count("every byte delivered") == 6, out[-2000:]
