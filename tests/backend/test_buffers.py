"""The buffers a group keeps from one quantized CPU allreduce to the next: reused (no growth for
calls of the same size), never leaking one call's bytes into another's result, and freed by
qcomm.release_buffers."""

import torch
import torch.distributed as dist

import qcomm
from qcomm import reference as ref

from dist_util import run_ranks


def _buffers_worker(rank, world):
    out = {}
    problems = []
    for algo in ("two_step", "ring", "semi_ring"):
        for rotate in (False, True):
            qcomm.set_config(qcomm.QuantConfig(algorithm=algo, min_bytes=0, rotate=rotate))
            qcomm.release_buffers()
            held = []
            # large, then smaller, then large again, each with its own values: a reused buffer
            # must not carry a byte of an earlier call into a later result
            for k, n in enumerate((300001, 1000, 77777, 300001, 300001)):
                xs = [
                    torch.randn(n, generator=torch.Generator().manual_seed(k * 10 + r)) * (k + 1)
                    for r in range(world)
                ]
                x = xs[rank].clone()
                dist.all_reduce(x)
                if not torch.equal(x, ref.allreduce(xs, algo, rotate=rotate).out):
                    problems.append(f"{algo} rotate={rotate} call {k}")
                held.append(qcomm.stats()["buffer_bytes"])
            freed = qcomm.release_buffers()
            out[(algo, rotate)] = (held, freed, qcomm.stats()["buffer_bytes"])
    return problems, out


def test_buffers_are_reused_exact_and_released():
    for problems, out in run_ranks(_buffers_worker, 3):
        assert problems == []
        for key, (held, freed, after) in out.items():
            assert held[0] > 0, key
            # the largest call sized them; the smaller ones and the repeats grew nothing
            assert held[1] == held[2] == held[3] == held[4] == held[0], (key, held)
            assert freed == held[-1] and after == 0, (key, freed, after)


def _threads_worker(rank, world):
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0))
    xs = [torch.randn(1 << 20, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    x = xs[rank].clone()
    dist.all_reduce(x)
    exact = torch.equal(x, ref.allreduce(xs).out)
    return qcomm.stats()["cpu_threads"], exact, torch.get_num_threads()


def test_codec_threads_default_splits_the_host_and_the_setting_overrides_it():
    import os

    cores = len(os.sched_getaffinity(0))
    # unset: torch's 2 intra-op threads, but the 2 ranks of this host share its cores
    for used, exact, torch_threads in run_ranks(_threads_worker, 2, threads=2):
        assert torch_threads == 2
        assert used == max(1, min(2, cores // 2)) and exact
    # set: that many, whatever torch's count (1 here); the same bits
    for used, exact, torch_threads in run_ranks(
        _threads_worker, 2, threads=1, env={"QCOMM_CPU_THREADS": "3"}
    ):
        assert torch_threads == 1  # the caller's count is not touched
        assert used == 3 and exact


def _in_message_worker(rank, world):
    # a 16-bit message's gather phase travels in the message itself (no buffers of its own);
    # where the message is not 16-byte aligned (a view one element in) it keeps its buffers. The
    # same bits either way, and those of the reference.
    out = {}
    problems = []
    n = 200_003
    for dtype in (torch.bfloat16, torch.float16):
        for algo in ("two_step", "ring", "semi_ring"):
            for bits in ((8, 8), (4, 8), (8, None), (4, 4)):
                # unrotated: a rotated message of 200003 elements runs on a padded copy, aligned
                # whatever the caller's view
                cfg = qcomm.QuantConfig(
                    algorithm=algo, rs_bits=bits[0], ag_bits=bits[1], min_bytes=0, rotate=False
                )
                qcomm.set_config(cfg)
                xs = [
                    torch.randn(n, generator=torch.Generator().manual_seed(7 * r + 1)).to(dtype)
                    for r in range(world)
                ]
                want = ref.allreduce(xs, algo, rs_bits=bits[0], ag_bits=bits[1], rotate=False).out
                held = {}
                for aligned in (True, False):
                    base = torch.empty(n + 8, dtype=dtype)
                    x = base[:n] if aligned else base[1 : n + 1]
                    x.copy_(xs[rank])
                    qcomm.release_buffers()
                    dist.all_reduce(x)
                    if not torch.equal(x, want):
                        problems.append(f"{dtype} {algo} {bits} aligned={aligned}")
                    held[aligned] = qcomm.stats()["buffer_bytes"]
                out[(str(dtype), algo, bits)] = held
    return problems, out


def test_the_gather_phase_of_16_bit_messages_needs_no_buffers():
    for problems, out in run_ranks(_in_message_worker, 3):
        assert problems == []
        for key, held in out.items():
            # without them the gather phase's send and receive units are gone: at least the
            # encoded message once (a third of 200003 elements at 4 bits is over 30 KiB)
            assert held[True] + 30_000 < held[False], (key, held)
