"""The speed of 4-bit ZeRO-1 traffic (issue 49): examples/zero1.py's small GPT, one training step
of each variant per round, interleaved (the first rotating), over slow_cluster.py's link:

  all4        qnccl: gradients reduce-scattered at 4 bits with their error fed back, weights
              all-gathered at 4 bits as differences (two_step, rotated)
  gloo        the same step with exact fp32 collectives on Gloo
  gloo_bf16   Gloo, the gradients and weights sent as bf16 (cast there and back): what a user
              would send instead on a fast link
  compute     no communication: the step's compute alone

Each step is timed as the slowest rank's, and so is its communication (the reduce-scatter and
the all-gather with their bookkeeping, timed inside the step; the step less `compute` says the
same, noisier). Then, on all4's state, the bookkeeping alone: the feedback's compensation (an
encode and decode of the gradients) and the two checksums of the weights a difference all-gather
takes, as a share of all4's step.

    sudo .venv/bin/python benchmarks/zero1_slow_link.py --rate 1gbit
    sudo .venv/bin/python benchmarks/zero1_slow_link.py --rate 1gbit --dim 512
    .venv/bin/python benchmarks/zero1_slow_link.py --rate loopback
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import qbench

sys.path.insert(0, os.path.join(qbench.ROOT, "examples"))

VARIANTS = ("all4", "gloo", "gloo_bf16", "compute")


def worker(args) -> int:
    import diloco
    import torch
    import torch.distributed as dist
    import zero1

    import qcomm
    from qcomm import delta

    cfg = zero1.config(grad_bits=4, feedback=True, weight_bits=4, deltas=True)
    timing = qbench.join(args, backend="qnccl", pg_options=cfg)
    gloo = dist.new_group(backend="gloo")
    train_ids, _, vocab = diloco.load_text()
    total = args.warmup + args.steps
    opts = {
        "all4": dict(feedback=True, deltas=True),
        "gloo": dict(group=gloo),
        "gloo_bf16": dict(group=gloo, comm_dtype=torch.bfloat16),
        "compute": dict(comm=False),
    }
    trainers = {
        v: zero1.Trainer(
            args.rank, args.world, vocab, len(VARIANTS) * total, dim=args.dim, **opts[v]
        )
        for v in VARIANTS
    }
    order = torch.Generator().manual_seed(1000)
    per_rank = args.batch // args.world
    comm = {v: [] for v in VARIANTS}

    def measure(v):
        x, y = zero1.sequences(train_ids, 64, args.batch, order)
        mine = slice(args.rank * per_rank, (args.rank + 1) * per_rank)
        took = []
        dt = qbench.timed_call(lambda: took.append(trainers[v].step(x[mine], y[mine])), timing)
        comm[v].append(qbench.slowest(took[0], timing))
        return dt

    times = qbench.interleave(VARIANTS, measure, args.steps, args.warmup, rotate=True)
    # the bookkeeping alone, on all4's state (20 repetitions, median)
    t = trainers["all4"]
    book = []
    for _ in range(20):
        t0 = time.perf_counter()
        t.fb.compensate(t.grads, None, t.rs_plan, t.cfg)
        delta._checksum(t.full)
        delta._checksum(t.full)
        book.append(time.perf_counter() - t0)
    book_s = qbench.slowest(statistics.median(book), timing)
    if args.rank == 0:
        params = sum(p.numel() for p in t.model.parameters())
        print(
            f"# ZeRO-1 TinyGPT (dim {args.dim}, {params} parameters, "
            f"fp32 {params * 4 / 2**20:.1f} MiB), "
            f"{args.world} ranks, {args.rate}, global batch {args.batch}, {args.steps} steps "
            f"after {args.warmup}; all4 quantized: "
            + ", ".join(
                f"{k} {v['quantized_calls']}"
                for k, v in sorted(qcomm.stats()["by_collective"].items())
            )  # fmt: skip
        )
        med = {v: statistics.median(times[v]) for v in VARIANTS}
        cm = {v: statistics.median(comm[v][-args.steps :]) for v in VARIANTS}
        head = ["variant", "step s", "range", "comm s (timed)", "comm / gloo_bf16",
                "step - compute", "/ gloo_bf16"]  # fmt: skip
        rows = []
        for v in VARIANTS:
            m, lo, hi = qbench.spread(times[v])
            sub = m - med["compute"]
            rows.append([v, f"{m:.3f}", f"{lo:.3f}-{hi:.3f}", f"{cm[v]:.4f}",
                         f"{cm[v] / cm['gloo_bf16']:.2f}", f"{sub:.4f}",
                         f"{sub / (med['gloo_bf16'] - med['compute']):.2f}"])  # fmt: skip
        print(qbench.md_table(head, rows))
        print(
            f"bookkeeping (feedback's compensation + 2 checksums): {book_s * 1e3:.1f} ms a step = "
            f"{book_s / med['all4']:.1%} of all4's step"
        )
    dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    qbench.add_cluster_args(ap, port=29757, timeout=1800)
    ap.add_argument("--batch", type=int, default=32, help="global batch (split over the ranks)")
    ap.add_argument("--dim", type=int, default=128, help="the model's width (heads: dim / 32)")
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    return qbench.dispatch(ap, __file__, worker)


if __name__ == "__main__":
    sys.exit(main())
