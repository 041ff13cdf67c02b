"""What the per-call plan agreement costs: one Gloo all-gather of the 96-byte plan header, which
every eager quantized allreduce makes before it moves data (CPU path and CUDA path alike; CUDA
graph replays skip it). Ranks are processes on this machine over loopback, so this is the floor of
that host round trip; across hosts add the network's latency.

    .venv/bin/python benchmarks/header_exchange.py --world 2 4 --iters 2000
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from dist_util import run_ranks  # noqa: E402

HEADER_BYTES = 96  # sizeof(PlanHeader): 12 int64 fields (csrc/plan/plan.h)


def _worker(rank, world, iters):
    send = torch.full((HEADER_BYTES,), rank, dtype=torch.uint8)
    recv = torch.empty(HEADER_BYTES * world, dtype=torch.uint8)
    for _ in range(200):  # warm-up: connections, allocations
        dist.all_gather_into_tensor(recv, send)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dist.all_gather_into_tensor(recv, send)
        times.append(time.perf_counter() - t0)
    assert recv.view(world, HEADER_BYTES)[:, 0].tolist() == list(range(world))
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    if args.iters < 10:
        ap.error("--iters must be at least 10")
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    print("| ranks | median us | p10 us | p90 us | p99 us |")
    print("|---|---|---|---|---|")
    for world in args.world:
        print(f"... {world} ranks, {args.iters} exchanges", file=sys.stderr, flush=True)
        per_rank = run_ranks(_worker, world, args.iters, backend="gloo", timeout=600)
        # a call ends when its slowest rank's does: the per-iteration maximum over ranks
        worst = sorted(max(ts) for ts in zip(*per_rank))
        q = statistics.quantiles(worst, n=100)
        med = statistics.median(worst)
        print(
            f"| {world} | {med * 1e6:.1f} | {q[9] * 1e6:.1f} | {q[89] * 1e6:.1f} | "
            f"{q[98] * 1e6:.1f} |"
        )


if __name__ == "__main__":
    main()
