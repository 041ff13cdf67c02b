"""FSDP2 training step time over a slow link: Gloo against qnccl with quantized reduce-scatters
(and all-gathers), side by side in one run.

The cluster is slow_cluster.py's (N ranks in network namespaces, a `tc tbf` limit of --rate each
way per rank). The model is --layers x (Linear(--width, --width) + ReLU), each Linear and the
model fully_shard'ed, with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16) unless
--fp32; batch --batch per rank (16: communication-bound). Variants, each its own copy of the same
model on its own process group of every rank:

  gloo          FSDP2 on a Gloo group (what a user picks first)
  rs8           qnccl, QuantConfig(reduce_scatter=True): gradients at 8 bits
  rs8_ag8       qnccl, reduce_scatter and all_gather at 8 bits (weights gathered at 8 bits too)
  rs4           qnccl, gradients at 4 bits, unrotated (rotate=False, as first measured)

Steps are interleaved: each round times one step (forward, backward, optimizer step) of every
variant after a barrier, as the slowest rank's time. Rank 0 prints each variant's median step time
(min-max) and its ratio to Gloo's, and the reduce-scatters and all-gathers qnccl quantized.

Needs root (ip netns, tc); --local runs it over loopback without (a smoke test). Example:
    sudo .venv/bin/python benchmarks/fsdp_slow_link.py --world 2 --rate 1gbit
"""

from __future__ import annotations

import argparse
import statistics
import sys

import qbench  # the namespaces and rate limits, the timing, the tables

VARIANTS = ("gloo", "rs8", "rs8_ag8", "rs4")


def _config(variant: str, min_bytes: int):
    import qcomm

    base = dict(tune=False, reduce_scatter=True, rotate=False, min_bytes=min_bytes)
    if variant == "rs8":
        return qcomm.QuantConfig(**base)
    if variant == "rs8_ag8":
        return qcomm.QuantConfig(all_gather=True, **base)
    return qcomm.QuantConfig(rs_bits=4, **base)


def worker(args) -> int:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import qcomm

    timing = qbench.join(args, "gloo")
    variants = args.variants.split(",")
    models, opts, groups = {}, {}, {}
    for v in variants:
        if v == "gloo":
            g = dist.new_group(backend="gloo")
        else:
            g = dist.new_group(backend="qnccl", pg_options=_config(v, args.min_bytes))
        groups[v] = g
        mesh = DeviceMesh.from_group(g, "cpu")
        torch.manual_seed(0)
        layers = []
        for _ in range(args.layers):
            layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers)
        kw = {"mesh": mesh}
        if not args.fp32:
            kw["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16
            )
        for m in model:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, **kw)
        fully_shard(model, **kw)
        models[v] = model
        opts[v] = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(args.rank))

    def step(v):
        loss = models[v](x).float().pow(2).mean()
        loss.backward()
        opts[v].step()
        opts[v].zero_grad()

    times = qbench.interleave(
        variants, lambda v: qbench.timed_call(lambda: step(v), timing), args.steps, args.warmup
    )
    if args.rank == 0:
        base = statistics.median(times["gloo"]) if "gloo" in times else None
        head = ["variant", "median_s", "min_s", "max_s", "vs_gloo", "rs_quantized", "ag_quantized"]
        rows = []
        for v in variants:
            med, lo, hi = qbench.spread(times[v])
            by = qcomm.stats(groups[v])["by_collective"] if v != "gloo" else None
            rows.append(
                [
                    v,
                    f"{med:.3f}",
                    f"{lo:.3f}",
                    f"{hi:.3f}",
                    f"{med / base:.2f}x" if base else "",
                    by["reduce_scatter"]["quantized_calls"] if by else "",
                    by["all_gather"]["quantized_calls"] if by else "",
                ]
            )
        print(
            f"# FSDP2 step, {args.layers} x Linear({args.width}) + ReLU, batch {args.batch}, "
            f"{'fp32' if args.fp32 else 'bf16 mixed precision'}, {args.world} ranks, "
            f"{'loopback (--local)' if args.local else args.rate}"
        )
        print(qbench.md_table(head, rows))
        if args.csv:
            qbench.write_csv(args.csv, rows, head)
    dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    qbench.add_cluster_args(ap, port=29588, timeout=1800)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--fp32", action="store_true", help="no mixed precision")
    ap.add_argument("--min-bytes", type=int, default=1 << 20, help="QuantConfig.min_bytes")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--csv", default=None)
    return qbench.dispatch(ap, __file__, worker)


if __name__ == "__main__":
    sys.exit(main())
