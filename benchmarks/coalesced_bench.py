"""Coalesced calls of many small tensors, DTensor's usual case: torch's functional collectives
(`all_gather_into_tensor_coalesced`, `reduce_scatter_tensor_coalesced`) and
`all_reduce_coalesced` of --count tensors of --size bytes each (fp32), on a qnccl group with
reduce-scatters and all-gathers opted in (the config's defaults otherwise: `auto`, the tuner on),
against the same calls on a Gloo group (what qnccl passes through), and Gloo on bf16 copies of
the tensors (what a user would send instead on a fast link).

qnccl packs the tensors of one call into one message (one agreement, one schedule); the tuner
then decides per size class whether quantizing it is faster than the exact call. Each round
times one call of every variant (interleaved, the first variant rotating), as the slowest rank's
time, after --warmup rounds (the tuner measures its classes there). Rank 0 prints, per
collective, each variant's median time (min-max) and its ratio to Gloo fp32's.

The cluster is slow_cluster.py's (network namespaces, `tc tbf` at --rate; root), or --rate
loopback (the ranks on this host). Examples:
    .venv/bin/python benchmarks/coalesced_bench.py --rate loopback
    sudo .venv/bin/python benchmarks/coalesced_bench.py --rate 1gbit --count 16 --size 64K
"""

from __future__ import annotations

import argparse
import sys

import qbench

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce")
VARIANTS = ("qnccl", "gloo", "gloo_bf16")


def _call(collective, group, tensors, world):
    """One coalesced call of `collective` on `tensors` (each rank's inputs), waited for."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    if collective == "all_gather":
        for t in funcol.all_gather_into_tensor_coalesced(tensors, group):
            funcol.wait_tensor(t)
    elif collective == "reduce_scatter":
        outs = funcol.reduce_scatter_tensor_coalesced(tensors, "sum", [0] * len(tensors), group)
        for t in outs:
            funcol.wait_tensor(t)
    else:
        dist.all_reduce_coalesced([t.clone() for t in tensors], group=group)


def worker(args) -> int:
    import warnings

    import torch
    import torch.distributed as dist

    import qcomm

    warnings.simplefilter("ignore")  # all_reduce_coalesced is deprecated in torch
    cfg = qcomm.QuantConfig(reduce_scatter=True, all_gather=True)
    timing = qbench.join(args, backend="qnccl", pg_options=cfg)
    groups = {"qnccl": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    groups["gloo_bf16"] = groups["gloo"]
    n = args.size // 4
    gen = torch.Generator().manual_seed(args.rank)
    base = {}
    for c in COLLECTIVES:
        # a reduce-scatter's inputs are W shards of its output
        numel = n * args.world if c == "reduce_scatter" else n
        base[c] = [torch.randn(numel, generator=gen) for _ in range(args.count)]
    rows = []
    for c in COLLECTIVES:
        data = {
            "qnccl": base[c],
            "gloo": base[c],
            "gloo_bf16": [t.to(torch.bfloat16) for t in base[c]],
        }

        def measure(v, c=c, data=data):
            return qbench.timed_call(lambda: _call(c, groups[v], data[v], args.world), timing)

        samples = qbench.interleave(
            VARIANTS, measure, rounds=args.rounds, warmup=args.warmup, rotate=True
        )
        ref = qbench.spread(samples["gloo"])[0]
        for v in VARIANTS:
            med, lo, hi = qbench.spread(samples[v])
            rows.append(
                [c, v, f"{med * 1e3:.2f}", f"{lo * 1e3:.2f}-{hi * 1e3:.2f}", f"{med / ref:.2f}"]
            )
    if args.rank == 0:
        by = qcomm.stats()["by_collective"]
        print(
            f"# {args.world} ranks, {args.rate}, {args.count} tensors x {args.size} B fp32, "
            f"{args.rounds} rounds after {args.warmup}; qnccl quantized calls: "
            + ", ".join(f"{k} {by[k]['quantized_calls']}" for k in sorted(by))
        )
        head = ["collective", "variant", "median ms", "range ms", "/ gloo"]
        print(qbench.md_table(head, rows))
    dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    qbench.add_cluster_args(ap, port=29731, timeout=900)
    ap.add_argument("--count", type=int, default=16, help="tensors per call")
    ap.add_argument("--size", type=qbench.parse_size, default=64 << 10, help="bytes per tensor")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=3)
    return qbench.dispatch(ap, __file__, worker)


if __name__ == "__main__":
    sys.exit(main())
