"""What an async quantized CPU allreduce gives a caller that computes meanwhile, over a slow link.

The cluster is slow_cluster.py's (N ranks in network namespaces, --rate each way per rank). Each
rank, for a --size fp32 tensor on a qnccl group (int8, default algorithm):
  * issue: how long dist.all_reduce(x, async_op=True) takes to return;
  * the allreduce alone, synchronous (T);
  * sync + compute: the allreduce, then a compute loop (float matmuls) calibrated to take T;
  * async + compute: issue async, the same compute, then wait().
Rounds are interleaved; each time is the slowest rank's. Rank 0 prints the medians (min-max) and
the ratio of the async total to the sync total (1.0: no overlap; 0.5: a perfect one), and writes
--csv.

Needs root (ip netns, tc). Example:
    sudo .venv/bin/python benchmarks/async_overlap.py --world 2 --rate 1gbit --size 64M
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import slow_cluster  # noqa: E402  (its namespaces and rate limits)


def worker(args) -> int:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, ROOT)
    import qcomm

    rank, world = args.rank, args.world
    ctl = slow_cluster.join(args)
    q = dist.new_group(
        backend="qnccl", pg_options=qcomm.QuantConfig(rs_bits=8, ag_bits=8, tune=False)
    )
    n = slow_cluster._parse_size(args.size) // 4
    x = torch.randn(n, generator=torch.Generator().manual_seed(rank))
    a = torch.randn(256, 256)

    def compute(reps):
        y = a
        for _ in range(reps):
            y = torch.tanh(y @ a)
        return y

    def slowest(dt):
        t = torch.tensor([dt], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctl)
        return float(t)

    # calibrate: T, then matmul repetitions that take T (rank 0's count, shared)
    dist.all_reduce(x.clone(), group=q)
    t0 = time.perf_counter()
    dist.all_reduce(x.clone(), group=q)
    T = slowest(time.perf_counter() - t0)
    t0 = time.perf_counter()
    compute(50)
    per = (time.perf_counter() - t0) / 50
    reps = torch.tensor([max(1, round(T / per))], dtype=torch.int64)
    dist.broadcast(reps, 0, group=ctl)
    reps = int(reps)

    times = {"issue": [], "allreduce": [], "compute": [], "sync+compute": [], "async+compute": []}

    def timed(body):
        # the tensor (and a Work, which holds it) is freed after the clock stops, when this
        # frame ends: freeing 64 MiB takes milliseconds and must not land inside a timing
        buf = x.clone()
        dist.barrier(group=ctl)
        t0 = time.perf_counter()
        body(buf)
        return time.perf_counter() - t0

    def issue_only(buf):
        issued.append(dist.all_reduce(buf, group=q, async_op=True))

    def overlapped(buf):
        w = dist.all_reduce(buf, group=q, async_op=True)
        compute(reps)
        w.wait()

    for _ in range(args.warmup + args.iters):
        issued = []
        r = {"issue": timed(issue_only)}
        issued.pop().wait()
        r["allreduce"] = timed(lambda b: dist.all_reduce(b, group=q))
        r["compute"] = timed(lambda b: compute(reps))
        r["sync+compute"] = timed(lambda b: (dist.all_reduce(b, group=q), compute(reps)))
        r["async+compute"] = timed(overlapped)
        for k, v in r.items():
            times[k].append(slowest(v))
    for k in times:
        times[k] = times[k][args.warmup :]
    med = {k: statistics.median(v) for k, v in times.items()}
    if rank == 0:
        print(
            f"# {world} ranks, {args.rate} each way, {args.size} fp32, qnccl int8 two_step, "
            f"{args.threads} thread(s) per rank, {os.cpu_count()} cores; {args.iters} rounds "
            f"(+{args.warmup}), interleaved; the slowest rank's time, median (min-max)"
        )
        for k, v in times.items():
            print(f"{k:14s} {med[k] * 1e3:9.2f} ms ({min(v) * 1e3:.2f}-{max(v) * 1e3:.2f})")
        ratio = med["async+compute"] / med["sync+compute"]
        print(f"async+compute / sync+compute: {ratio:.3f} (a fall of {100 * (1 - ratio):.1f}%)")
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                wr = csv.writer(f)
                wr.writerow(["what", "median_s", "min_s", "max_s", "rate", "size", "world"])
                for k, v in times.items():
                    wr.writerow([k, med[k], min(v), max(v), args.rate, args.size, world])
    dist.destroy_process_group(q)
    dist.destroy_process_group(ctl)
    dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    slow_cluster.add_cluster_args(ap, port=29585, timeout=1800, delay=False)
    ap.add_argument("--size", default="64M")
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--csv", default=None)
    return slow_cluster.dispatch(ap, __file__, worker)


if __name__ == "__main__":
    sys.exit(main())
