"""Time as the slowest rank's: a collective call, or a training step, ends for the job when its
slowest rank's does, so every benchmark reports the max over ranks of each rank's time.

slowest (in the ranks: an allreduce MAX over a group that no timed call uses), timed_call (a
barrier, one timed call, its slowest rank's time), per_call_max (in the parent, from the times
every rank returned); interleave (every configuration once per round, round after round, so that
a shared machine's drifting load reaches each alike) and spread (median, min, max).
"""

from __future__ import annotations

import statistics
import time


def slowest(seconds, group=None):
    """The slowest rank's time, on every rank of `group`: the max over its ranks of this rank's
    `seconds`, a number, or a list (each position's max: one allreduce for all of them; [] for an
    empty list, with no communication, which every rank must then have)."""
    import torch
    import torch.distributed as dist

    one = isinstance(seconds, (int, float))
    values = [seconds] if one else list(seconds)
    if not values:
        return []
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t[0]) if one else t.tolist()


def timed_call(fn, group, make=None, cpu=False):
    """One call timed as the slowest rank's: make() first when given (the call's fresh argument,
    e.g. a copy of the input, made before the clock), a barrier on `group`, then fn(made), or fn()
    without make, timed with the host clock; returns slowest over `group`. With cpu: [wall seconds,
    CPU seconds of this process in the call (all its threads)], each the slowest rank's."""
    import torch.distributed as dist

    arg = make() if make is not None else None
    dist.barrier(group=group)
    if cpu:
        c0 = time.process_time()
    t0 = time.perf_counter()
    if make is None:
        fn()
    else:
        fn(arg)
    wall = time.perf_counter() - t0
    if cpu:
        return slowest([wall, time.process_time() - c0], group)
    return slowest(wall, group)


def per_call_max(per_rank) -> list:
    """In the parent, from each rank's list of call times (the same calls, in order): each call's
    slowest rank's time."""
    return [max(ts) for ts in zip(*per_rank)]


def interleave(variants, measure, rounds: int, warmup: int = 0, rotate: bool = False) -> dict:
    """measure(v) of every variant once per round, round after round: `warmup` rounds first, not
    kept, then `rounds` kept. rotate: round i starts with variant i mod len(variants), so that none
    is always first. Returns {variant: [what measure returned in each kept round]}."""
    order = list(variants)
    samples = {v: [] for v in order}
    for i in range(warmup + rounds):
        turn = order[i % len(order) :] + order[: i % len(order)] if rotate and order else order
        for v in turn:
            got = measure(v)
            if i >= warmup:
                samples[v].append(got)
    return samples


def spread(samples):
    """(median, min, max) of the samples."""
    return statistics.median(samples), min(samples), max(samples)
