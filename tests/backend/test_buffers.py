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
