"""PyTorch-native tensor parallelism with sequence parallelism over a slow link: one transformer
block (attention and MLP, examples/native_tp.py) under `parallelize_module`, its forward and
backward step on a qnccl group that quantizes its all-gathers and reduce-scatters at 8 bits,
against the same block on Gloo, side by side in one run.

Variants (each its own copy of the block, parallelized on its own mesh):

  qnccl         fp32 block, the default group: qnccl with QuantConfig(reduce_scatter=True,
                all_gather=True, tune=False): every collective of the step quantized
  gloo          fp32 block on a Gloo group (what qnccl passes through)
  gloo_bf16     the block in bf16 on a Gloo group: what a user sends instead on a fast link
  compute_fp32  the fp32 block on a "fake" group (torch's FakeProcessGroup: no communication,
                the shapes of the real thing): the step's compute alone
  compute_bf16  the same in bf16

Each round times one step of every variant (the first rotating) after a barrier, as the slowest
rank's time. Rank 0 prints each variant's median step (min-max), its ratio to Gloo fp32's, the
communication (the step less its dtype's compute alone: on a machine without native bf16 GEMMs
the bf16 step is mostly compute), the quantized calls per step, and the relative L2 error of
qnccl's output against Gloo's.

Needs root (ip netns, tc); --rate loopback runs the ranks on this host without. Example:
    sudo .venv/bin/python benchmarks/tp_block_slow_link.py --rate 1gbit
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import qbench

sys.path.insert(0, os.path.join(qbench.ROOT, "examples"))

VARIANTS = ("qnccl", "gloo", "gloo_bf16", "compute_fp32", "compute_bf16")


def worker(args) -> int:
    import native_tp
    import torch
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")
    from torch.distributed.device_mesh import DeviceMesh

    import qcomm

    cfg = qcomm.QuantConfig(reduce_scatter=True, all_gather=True, tune=False)
    timing = qbench.join(args, backend="qnccl", pg_options=cfg)
    # the fake group's outputs are whatever memory held: no denormal slows its compute
    torch.set_flush_denormal(True)
    groups = {"qnccl": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    groups["gloo_bf16"] = groups["gloo"]
    groups["compute_fp32"] = groups["compute_bf16"] = dist.new_group(backend="fake")
    variants = args.variants.split(",")
    torch.manual_seed(0)
    base = native_tp.Block(args.dim, args.heads, args.ffn)
    models, inputs = {}, {}
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(args.batch, args.seq, args.dim, generator=gen)
    for v in variants:
        dtype = torch.bfloat16 if v.endswith("bf16") else torch.float32
        # a mesh name of its own: DTensor treats meshes of the same ranks and names as one (its
        # caches would hand one variant's mesh, and group, to another)
        mesh = DeviceMesh.from_group(groups[v], "cpu", mesh_dim_names=(v,))
        models[v] = native_tp.parallel_block(copy.deepcopy(base).to(dtype), mesh)
        inputs[v] = native_tp.local_input(x, args.rank, args.world).to(dtype)
    outs, calls = {}, {}

    def step(v):
        model = models[v]
        for p in model.parameters():
            p.grad = None
        out = model(inputs[v])
        out.float().square().sum().backward()
        outs[v] = out.detach().float()

    def measure(v):
        before = qcomm.stats()["by_collective"]
        dt = qbench.timed_call(lambda: step(v), timing)
        after = qcomm.stats()["by_collective"]
        calls[v] = sum(after[c]["quantized_calls"] - before[c]["quantized_calls"] for c in after)
        return dt

    times = qbench.interleave(variants, measure, args.steps, args.warmup, rotate=True)
    if args.rank == 0:
        mib = args.batch * args.seq * args.dim * 4 / 2**20
        print(
            f"# native TP+SP block, {args.world} ranks, {args.rate}: dim {args.dim}, heads "
            f"{args.heads}, ffn {args.ffn}, tokens {args.batch}x{args.seq} (fp32 activations "
            f"{mib:.1f} MiB a call), {args.steps} steps after {args.warmup}"
        )
        med = {v: qbench.spread(times[v])[0] for v in variants}

        def comm(v):
            alone = "compute_bf16" if v.endswith("bf16") else "compute_fp32"
            return med[v] - med[alone] if alone in med and not v.startswith("compute") else None

        head = ["variant", "median_s", "range_s", "/ gloo", "comm_s", "comm / gloo", "quantized"]
        rows = []
        for v in variants:
            m, lo, hi = qbench.spread(times[v])
            c = comm(v)
            ratio = f"{m / med['gloo']:.2f}" if "gloo" in med else ""
            cr = f"{c / comm('gloo'):.2f}" if c is not None and comm("gloo") else ""
            rows.append([v, f"{m:.3f}", f"{lo:.3f}-{hi:.3f}", ratio,
                         "" if c is None else f"{c:.3f}", cr, calls[v]])  # fmt: skip
        print(qbench.md_table(head, rows))
        if "qnccl" in outs and "gloo" in outs:
            err = float((outs["qnccl"] - outs["gloo"]).norm() / outs["gloo"].norm())
            print(f"qnccl output against Gloo's: relative L2 {err:.2e}")
    dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    qbench.add_cluster_args(ap, port=29743, timeout=1800)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    return qbench.dispatch(ap, __file__, worker)


if __name__ == "__main__":
    sys.exit(main())
