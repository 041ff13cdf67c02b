"""What an async quantized CPU allreduce gives a caller that computes meanwhile, over a slow link.

The cluster is slow_cluster.py's (N ranks in network namespaces, --rate each way per rank). Each
rank, for a --size fp32 tensor on a qnccl group (int8, default algorithm):
  * issue: how long dist.all_reduce(x, async_op=True) takes to return;
  * the allreduce alone, synchronous (T);
  * sync + compute: the allreduce, then a compute loop (float matmuls) calibrated to take T;
  * async + compute: issue async, the same compute, then wait().
Rounds are interleaved; each time is the slowest rank's. Rank 0 prints the medians (min-max) and
the ratio of the async total to the sync total (1.0: no overlap; 0.5: a perfect one), and writes
--csv. Beside each time: the CPU seconds the rank's process spent in it (all its threads), and
from them the floor any overlap has on this machine: a rank cannot finish sooner than its CPU work
takes on its share of the cores.

Needs root (ip netns, tc). Example:
    sudo .venv/bin/python benchmarks/async_overlap.py --world 2 --rate 1gbit --size 64M
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import qbench  # the namespaces and rate limits, the timing


def worker(args) -> int:
    import torch
    import torch.distributed as dist

    import qcomm

    rank, world = args.rank, args.world
    ctl = qbench.join(args)
    q = dist.new_group(
        backend="qnccl", pg_options=qcomm.QuantConfig(rs_bits=8, ag_bits=8, tune=False)
    )
    n = qbench.parse_size(args.size) // 4
    x = torch.randn(n, generator=torch.Generator().manual_seed(rank))
    a = torch.randn(256, 256)

    def compute(reps):
        y = a
        for _ in range(reps):
            y = torch.tanh(y @ a)
        return y

    def slowest(dt):
        return qbench.slowest(dt, ctl)

    # calibrate: T (the median of three synchronous calls), then matmul repetitions that take T:
    # a first guess from 20 repetitions, rescaled once from a run of that many (rank 0's count,
    # shared). A single short timing, taken while the peer still finished its call, came out up to
    # 1.7x off.
    def median_of(n, fn):
        return statistics.median([qbench.timed_call(fn, ctl, x.clone) for _ in range(n)])

    dist.all_reduce(x.clone(), group=q)
    T = median_of(3, lambda b: dist.all_reduce(b, group=q))
    compute(5)
    reps = max(1, round(T / (median_of(1, lambda b: compute(20)) / 20)))
    reps = max(1, round(reps * T / median_of(3, lambda b: compute(reps))))
    reps = torch.tensor([reps], dtype=torch.int64)
    dist.broadcast(reps, 0, group=ctl)
    reps = int(reps)

    times = {"issue": [], "allreduce": [], "compute": [], "sync+compute": [], "async+compute": []}
    # CPU seconds of the whole process (every thread: caller, progress thread, Gloo's, and the
    # kernel's network work charged to them) inside each timing
    cpu = {k: [] for k in times}

    def timed(body):
        # the tensor (and a Work, which holds it) is freed after the clock stops, when this
        # frame ends: freeing 64 MiB takes milliseconds and must not land inside a timing
        buf = x.clone()
        dist.barrier(group=ctl)
        c0, t0 = time.process_time(), time.perf_counter()
        body(buf)
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        timed.cpu = dc
        return dt

    def issue_only(buf):
        issued.append(dist.all_reduce(buf, group=q, async_op=True))

    def overlapped(buf):
        w = dist.all_reduce(buf, group=q, async_op=True)
        compute(reps)
        w.wait()

    for _ in range(args.warmup + args.iters):
        issued = []
        r, c = {"issue": timed(issue_only)}, {}
        c["issue"] = timed.cpu
        issued.pop().wait()
        r["allreduce"] = timed(lambda b: dist.all_reduce(b, group=q))
        c["allreduce"] = timed.cpu
        r["compute"] = timed(lambda b: compute(reps))
        c["compute"] = timed.cpu
        r["sync+compute"] = timed(lambda b: (dist.all_reduce(b, group=q), compute(reps)))
        c["sync+compute"] = timed.cpu
        r["async+compute"] = timed(overlapped)
        c["async+compute"] = timed.cpu
        for k, v in r.items():
            times[k].append(slowest(v))
            cpu[k].append(slowest(c[k]))
    for k in times:
        times[k] = times[k][args.warmup :]
        cpu[k] = cpu[k][args.warmup :]
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    if rank == 0:
        print(
            f"# {world} ranks, {args.rate} each way, {args.size} fp32, qnccl int8 two_step, "
            f"{args.threads} thread(s) per rank, {os.cpu_count()} cores; {args.iters} rounds "
            f"(+{args.warmup}), interleaved; the slowest rank's time, median (min-max)"
        )
        cores = (os.cpu_count() or 1) / world
        print(f"{'':14s} {'wall':>9s}    {'(min-max)':19s} {'CPU of the rank':>15s}")
        for k, v in times.items():
            span = f"({min(v) * 1e3:.2f}-{max(v) * 1e3:.2f})"
            print(f"{k:14s} {med[k] * 1e3:9.2f} ms {span:19s} {med_cpu[k] * 1e3:12.2f} ms")
        ratio = med["async+compute"] / med["sync+compute"]
        print(f"async+compute / sync+compute: {ratio:.3f} (a fall of {100 * (1 - ratio):.1f}%)")
        # the best any overlap can do on this machine: the work of the synchronous pair that
        # needs a core, spread over this rank's share of the cores, or the longer of the two parts
        floor = max(med_cpu["sync+compute"] / cores, med["allreduce"], med["compute"])
        print(
            f"CPU-bound floor: {floor * 1e3:.2f} ms = max(CPU of sync+compute / {cores:g} cores a "
            f"rank, allreduce, compute), {floor / med['sync+compute']:.3f} of sync+compute"
        )
        if args.csv:
            head = ["what", "median_s", "min_s", "max_s", "cpu_median_s", "rate", "size", "world"]
            rows = [
                [k, med[k], min(v), max(v), med_cpu[k], args.rate, args.size, world]
                for k, v in times.items()
            ]
            qbench.write_csv(args.csv, rows, head)
    dist.destroy_process_group(q)
    dist.destroy_process_group(ctl)
    dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    qbench.add_cluster_args(ap, port=29585, timeout=1800, delay=False)
    ap.add_argument("--size", default="64M")
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--csv", default=None)
    return qbench.dispatch(ap, __file__, worker)


if __name__ == "__main__":
    sys.exit(main())
