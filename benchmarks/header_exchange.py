"""What the per-call plan agreement costs, and what replaced it on the CUDA-IPC path.

Every eager quantized CPU allreduce (and every CUDA one over the NCCL transport, or under
QCOMM_DEBUG=CHECK) first all-gathers its 104-byte plan header over Gloo on the host. The CUDA-IPC
path instead compares a 32-bit fingerprint of the plan in its first barrier kernel, on the device
(csrc/cuda/ipc_barrier.h); the host only computes the fingerprint. This prints, on processes of
this machine over loopback (the floor of the host round trip; across hosts add the network's
latency):

* the header exchange alone (a Gloo all-gather of the header's bytes), per-iteration maximum over
  ranks, after 200 warm-up exchanges;
* the host cost of the fingerprint that replaces it (qcomm.plan_fingerprint: the plan
  built and hashed, plus a Python call's overhead, so an upper bound);
* with --share, the header exchange's share of a quantized CPU allreduce of each size, timed in
  the same processes, in rounds of one allreduce and then ten exchanges (the CPU path keeps its
  exchange: this says what it costs there).

    .venv/bin/python benchmarks/header_exchange.py --world 2 --iters 2000 --share 1M 16M
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import qbench
import torch
import torch.distributed as dist

HEADER_BYTES = 104  # sizeof(PlanHeader): 13 int64 fields (csrc/plan/plan.h)


def _exchange_times(group, world, iters, rank):
    send = torch.full((HEADER_BYTES,), rank, dtype=torch.uint8)
    recv = torch.empty(HEADER_BYTES * world, dtype=torch.uint8)
    for _ in range(200):  # warm-up: connections, allocations
        dist.all_gather_into_tensor(recv, send, group=group)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        dist.all_gather_into_tensor(recv, send, group=group)
        times.append(time.perf_counter() - t0)
    assert recv.view(world, HEADER_BYTES)[:, 0].tolist() == list(range(world))
    return times


def _worker(rank, world, iters, share):
    import qcomm

    gloo = dist.new_group(backend="gloo")
    out = {"exchange": _exchange_times(gloo, world, iters, rank), "share": {}}
    # the share: rounds of one quantized allreduce, then ten header exchanges, interleaved
    cfg = qcomm.QuantConfig(min_bytes=0, tune=False)
    qcomm.set_config(cfg)
    send = torch.full((HEADER_BYTES,), rank, dtype=torch.uint8)
    recv = torch.empty(HEADER_BYTES * world, dtype=torch.uint8)
    for size in share:
        x = torch.randn(size // 4, generator=torch.Generator().manual_seed(rank))
        y = x.clone()
        pairs = []
        for i in range(32):
            y.copy_(x)
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            dist.all_reduce(y)
            t1 = time.perf_counter()
            for _ in range(10):  # the exchange in steady state, between the calls
                dist.all_gather_into_tensor(recv, send, group=gloo)
            t2 = time.perf_counter()
            if i >= 2:  # two warm-up rounds
                pairs.append(((t2 - t1) / 10, t1 - t0))
        out["share"][size] = pairs
    return out


def _fingerprint_us(calls=20000):
    import qcomm

    cfg = qcomm.QuantConfig(min_bytes=0).encoded()
    fp = qcomm.plan_fingerprint
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(calls):
            fp(1 << 20, torch.float32, cfg, False, i)
        best.append((time.perf_counter() - t0) / calls)
    return statistics.median(best) * 1e6


def _quantiles(xs):
    q = statistics.quantiles(xs, n=100)
    return statistics.median(xs), q[9], q[89], q[98]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, nargs="+", default=[2])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument(
        "--share",
        type=qbench.parse_size,
        nargs="*",
        default=[],
        help="message sizes (K/M/G) whose quantized allreduce the exchange is timed against",
    )
    args = ap.parse_args()
    if args.iters < 10:
        ap.error("--iters must be at least 10")
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, torch {torch.__version__}")
    print(qbench.md_head(["ranks", "header exchange median us", "p10 us", "p90 us", "p99 us"]))
    shares = []
    for world in args.world:
        print(f"... {world} ranks, {args.iters} exchanges", file=sys.stderr, flush=True)
        per_rank = qbench.run_ranks(
            _worker,
            world,
            args.iters,
            args.share,
            timeout=1200,
            env={"QCOMM_TUNE": "0"},
            start_method="forkserver",
        )
        # a call ends when its slowest rank's does: the per-iteration maximum over ranks
        worst = sorted(qbench.per_call_max(r["exchange"] for r in per_rank))
        med, p10, p90, p99 = _quantiles(worst)
        print(qbench.md_row([world] + [f"{t * 1e6:.1f}" for t in (med, p10, p90, p99)]))
        for size in args.share:
            rounds = [r["share"][size] for r in per_rank]
            hdr = statistics.median(qbench.per_call_max([p[0] for p in rs] for rs in rounds))
            call = statistics.median(qbench.per_call_max([p[1] for p in rs] for rs in rounds))
            shares.append((world, size, hdr, call))
    print(f"\nthe fingerprint instead (host, incl. a Python call): {_fingerprint_us():.2f} us")
    if shares:
        head = ["ranks", "size", "header us", "quantized allreduce us", "header / allreduce"]
        print("\n" + qbench.md_head(head))
        for world, size, hdr, call in shares:
            cells = [world, qbench.size_label(size), f"{hdr * 1e6:.1f}", f"{call * 1e6:.1f}"]
            print(qbench.md_row(cells + [f"{hdr / call:.3f}"]))
        print(
            "(medians of 30 rounds, each the maximum over ranks: one quantized allreduce, two_step"
            " 8/8 fp32, then 10 exchanges, whose mean is the round's header time)"
        )


if __name__ == "__main__":
    main()
