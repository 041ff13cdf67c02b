"""The main job's measurement, shared with benchmarks/allreduce_sweep.py: every rank's
deterministic input, the checked allreduce runner (fresh copy, barrier, one timed call, the
slowest rank's time; every output compared bit for bit across ranks) and the errors against the
exact float64 sum."""

from __future__ import annotations

import time

from .timing import slowest


def _seed(base: int, rank: int, count: int) -> int:
    return (base * 1_000_003 + rank * 7_919 + count * 104_729) % (1 << 62)


def make_input(base_seed: int, rank: int, count: int, dtype):
    """Rank `rank`'s input of `count` N(0,1) elements in `dtype`, the same for the same seed."""
    import torch

    g = torch.Generator().manual_seed(_seed(base_seed, rank, count))
    return torch.randn(count, generator=g, dtype=torch.float32).to(dtype)


def bytes_view(t):
    """The raw bytes of t (uint8, which Gloo broadcasts for every dtype; int16 it does not)."""
    import torch

    return t.view(torch.uint8)


def errors(out, exact):
    """(||out - exact||_2 / ||exact||_2, max |out - exact|) against the float64 exact result."""
    d = out.double() - exact
    en = float(exact.norm())
    rel = float(d.norm()) / en if en > 0 else float("nan")
    return rel, float(d.abs().max())


class Runner:
    """What one rank needs to time and check one configuration: gloo is a Gloo group over the same
    ranks for the barriers, the slowest-rank reductions and the bit comparisons."""

    def __init__(self, rank, world, gloo):
        self.rank, self.world, self.gloo = rank, world, gloo

    def run(self, inp, buf, scratch, group, warmup, iters, call=None):
        """warmup + iters allreduces of a fresh copy of inp; returns (the slowest rank's times of
        the timed calls in seconds, number of calls whose output differed across ranks, whether
        some rank's output changed between calls). call(buf), when given, is timed instead of
        ``dist.all_reduce(buf, SUM, group)`` (e.g. a cast to bf16, an allreduce and a cast back);
        it must leave its result in buf."""
        import torch
        import torch.distributed as dist

        times = []
        mismatches = 0
        first = None
        changed = False
        for i in range(warmup + iters):
            buf.copy_(inp)
            dist.barrier(group=self.gloo)
            t0 = time.perf_counter()
            if call is None:
                dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group)
            else:
                call(buf)
            t1 = time.perf_counter()
            if i >= warmup:
                times.append(t1 - t0)
            # bit-identical across ranks: broadcast rank 0's bits, compare with ours
            bits = bytes_view(buf)
            if self.rank == 0:
                scratch.copy_(bits)
            dist.broadcast(scratch, src=0, group=self.gloo)
            if not torch.equal(scratch, bits):
                mismatches += 1
            # and across calls on this rank (same input, same config)
            if first is None:
                first = bits.clone()
            elif not torch.equal(first, bits):
                changed = True
        times = slowest(times, self.gloo)
        flags = torch.tensor([mismatches, int(changed)], dtype=torch.int64)
        dist.all_reduce(flags, op=dist.ReduceOp.SUM, group=self.gloo)
        return times, int(flags[0]), int(flags[1])
