"""Megatron-core tensor parallelism with sequence parallelism over a slow link: the step time
with the TP group exact against its reduce-scatters (and all-gathers) quantized, side by side in
one run.

The cluster is slow_cluster.py's (N ranks in network namespaces, a `tc tbf` limit of --rate each
way per rank). qnccl is the default group with algorithm="none" (exact: Gloo underneath), Megatron
creates its groups on it (TP = --world), and qcomm.megatron.quantize_tensor_parallel switches the
TP group's config between variants. The model is --layers blocks of ColumnParallelLinear(--hidden,
--ffn) -> GELU -> RowParallelLinear(--ffn, --hidden), sequence_parallel=True, --seq tokens x
--batch split along the sequence. Each block all-gathers its input and reduce-scatters its
output in the forward, and the reverse in the backward. Variants:

  exact     the TP group passes through (what Megatron sends without qnccl)
  rs8       reduce-scatters at 8 bits (QuantConfig(reduce_scatter=True)), all-gathers exact
  rs8_ag8   reduce-scatters and all-gathers at 8 bits (the forward computes on 8-bit activations)
  rs4_ag8   reduce-scatters at 4 bits, all-gathers at 8 bits

Steps are interleaved: each round times one forward and backward of every variant after a
barrier, as the slowest rank's time. Rank 0 prints each variant's median step time (min-max), its
ratio to exact, the relative L2 error of the output against the exact variant's, and how many
calls were quantized.

Needs root (ip netns, tc); --local runs it over loopback without (a smoke test). Example:
    sudo .venv/bin/python benchmarks/megatron_slow_link.py --world 2 --rate 1gbit
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import qbench  # the namespaces and rate limits, the timing, the tables

VARIANTS = ("exact", "rs8", "rs8_ag8", "rs4_ag8")


def _config(variant: str, min_bytes: int):
    import qcomm

    if variant == "exact":
        return qcomm.QuantConfig(algorithm="none")
    base = dict(tune=False, min_bytes=min_bytes, reduce_scatter=True)
    if variant == "rs8":
        return qcomm.QuantConfig(**base)
    if variant == "rs8_ag8":
        return qcomm.QuantConfig(all_gather=True, **base)
    return qcomm.QuantConfig(all_gather=True, rs_bits=4, ag_bits=8, **base)


def worker(args) -> int:
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    import qcomm
    import qcomm.megatron

    timing = qbench.join(args, "qnccl", pg_options=qcomm.QuantConfig(algorithm="none"))
    # Megatron-core's sequence-parallel mappings allocate their buffers on
    # torch.cuda.current_device(); on CPU ranks that device is the CPU
    torch.cuda.current_device = lambda: "cpu"
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # silences its GPU advice
    ps.initialize_model_parallel(tensor_model_parallel_size=args.world)
    tp = ps.get_tensor_model_parallel_group()
    mp = ModelParallelConfig(
        tensor_model_parallel_size=args.world,
        use_cpu_initialization=True,
        gradient_accumulation_fusion=False,
        sequence_parallel=True,
    )

    def init(w):
        return torch.nn.init.normal_(w, std=0.02)

    torch.manual_seed(1234)
    blocks = []
    for _ in range(args.layers):
        col = ColumnParallelLinear(args.hidden, args.ffn, config=mp, init_method=init,
                                   bias=True, gather_output=False)  # fmt: skip
        row = RowParallelLinear(args.ffn, args.hidden, config=mp, init_method=init, bias=True,
                                input_is_parallel=True, skip_bias_add=False)  # fmt: skip
        blocks.append((col, row))
    part = args.seq // args.world  # this rank's part of the sequence
    gen = torch.Generator().manual_seed(99)
    xs = torch.randn(args.seq, args.batch, args.hidden, generator=gen)
    gs = torch.randn(args.seq, args.batch, args.hidden, generator=gen)
    mine = slice(args.rank * part, (args.rank + 1) * part)

    def step():
        x = xs[mine].clone().requires_grad_(True)
        for col, row in blocks:
            for p in list(col.parameters()) + list(row.parameters()):
                p.grad = None
        h = x
        for col, row in blocks:
            a, _ = col(h)
            h, _ = row(torch.nn.functional.gelu(a))
        h.backward(gs[mine])
        return h.detach()

    variants = args.variants.split(",")
    configs = {v: _config(v, args.min_bytes) for v in variants}
    outs, calls = {}, {v: [0, 0] for v in variants}

    def measure(v):
        qcomm.megatron.quantize_tensor_parallel(configs[v])
        qcomm.reset_stats(tp)
        y = []
        dt = qbench.timed_call(lambda: y.append(step()), timing)
        by = qcomm.stats(tp)["by_collective"]
        calls[v] = [
            by["reduce_scatter"]["quantized_calls"],
            by["all_gather"]["quantized_calls"],
        ]
        outs[v] = y[0]
        return dt

    times = qbench.interleave(variants, measure, args.steps, args.warmup)
    if args.rank == 0:
        base = statistics.median(times["exact"]) if "exact" in times else None
        mib = args.seq * args.batch * args.hidden * 4 / 2**20
        print(
            f"# Megatron-core TP={args.world} sequence parallel, {args.layers} x (Column "
            f"{args.hidden}->{args.ffn}, GELU, Row {args.ffn}->{args.hidden}), tokens "
            f"{args.seq}x{args.batch} (fp32 activations {mib:.0f} MiB a call), "
            f"{'loopback (--local)' if args.local else args.rate}, {args.steps} steps"
        )
        head = ["variant", "median_s", "min_s", "max_s", "vs_exact", "out_rel_l2", "rs_q", "ag_q"]
        rows = []
        for v in variants:
            med, lo, hi = qbench.spread(times[v])
            err = ""
            if "exact" in outs:
                err = f"{float((outs[v] - outs['exact']).norm() / outs['exact'].norm()):.2e}"
            rows.append([v, f"{med:.3f}", f"{lo:.3f}", f"{hi:.3f}",
                         f"{med / base:.2f}x" if base else "", err, *calls[v]])  # fmt: skip
        print(qbench.md_table(head, rows))
    ps.destroy_model_parallel()
    dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    qbench.add_cluster_args(ap, port=29599, timeout=1800)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--min-bytes", type=int, default=1 << 20, help="QuantConfig.min_bytes")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=1)
    return qbench.dispatch(ap, __file__, worker)


if __name__ == "__main__":
    sys.exit(main())
