"""A bandwidth-limited CPU cluster on one machine: N ranks, each in its own network namespace.

Topology: namespaces qcomm-r0 .. qcomm-r{N-1} and a switch namespace qcomm-sw holding a bridge.
Each rank reaches the bridge through a veth pair; a `tc tbf` rate limit on both ends of each pair
limits the rank's upload and download to --rate (optional --delay adds netem latency). Addresses
10.77.0.1.. live only inside these namespaces. Gloo is bound to each rank's veth
(GLOO_SOCKET_IFNAME). Everything is removed at the end, also on failure or Ctrl-C.

Each rank runs, for each --size: Gloo's exact allreduce in fp32 and in bf16, then the quantized
allreduce for each --algorithms x --bits, every one --iters times (median, and min/max for spread);
with --interleave, Gloo's two and every configuration once per round, round after round.
Rank 0 prints a table with ratios measured side by side in this one run, and writes --csv. With
--isas generic,avx512 (say) every quantized configuration runs once with each instruction set of
the CPU codec loops (qcomm.set_cpu_isa on every rank), labelled "algorithm [isa]".

--collective reduce_scatter (or all_gather) times that collective instead, Gloo's against qnccl's
(QuantConfig(reduce_scatter=True, all_gather=True)); a size is then the message: the
reduce-scatter's input, the all-gather's output (each rank's shard is 1/W of it).

Needs root (ip netns, tc). Example, the setting of issue 4:
    sudo .venv/bin/python benchmarks/slow_cluster.py --world 2 --rate 1gbit --sizes 64M
    sudo .venv/bin/python benchmarks/slow_cluster.py --collective reduce_scatter --bits 8/8
--local runs the ranks on this host over loopback instead, with no namespace or rate limit and no
root: a smoke test that the script runs, not a measurement.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import qbench

# the cluster itself is the library's (qbench.cluster); examples/diloco.py starts its ranks through
# these names of this module
from qbench import SUBNET, run_workers  # noqa: F401


def collective(name: str, x, group=None) -> None:
    """One `name` collective ("all_reduce", "reduce_scatter", "all_gather") of the message x on
    `group` (x: the allreduce's tensor, the reduce-scatter's input, or the all-gather's output,
    whose own shard is the input)."""
    import torch
    import torch.distributed as dist

    w = dist.get_world_size(group)
    if name == "all_reduce":
        dist.all_reduce(x, group=group)
    elif name == "reduce_scatter":
        out = torch.empty(x.numel() // w, dtype=x.dtype)
        dist.reduce_scatter_tensor(out, x, group=group)
    else:
        n = x.numel() // w
        out = torch.empty(n * w, dtype=x.dtype)
        dist.all_gather_into_tensor(out, x[:n], group=group)


def worker(args) -> int:
    import torch
    import torch.distributed as dist

    import qcomm

    rank = args.rank
    gloo = qbench.join(args, "qnccl", qcomm.QuantConfig(min_bytes=0))
    rows = []

    def timed(fn, make, rounds):
        """`rounds` calls of fn(make()), each timed as the slowest rank's."""
        return [qbench.timed_call(fn, gloo, make) for _ in range(rounds)]

    what_call = args.collective
    for size in qbench.parse_sizes(args.sizes):
        n = size // 4 // args.world * args.world  # whole shards
        x = torch.randn(n, generator=torch.Generator().manual_seed(rank))
        base = {}
        baselines = (("gloo_fp32", torch.float32), ("gloo_bf16", torch.bfloat16))
        base_samples = {name: [] for name, _ in baselines}

        def exact(t):
            collective(what_call, t, gloo)

        if not args.interleave:
            for name, dtype in baselines:
                times = timed(exact, lambda x=x, dtype=dtype: x.to(dtype), args.warmup + args.iters)
                med, lo, hi = qbench.spread(times[args.warmup :])
                base_samples[name] = None
                base[name] = med
                rows.append([size, name, "-", med, lo, hi, "", "", ""])
                if rank == 0:
                    print(f"[{size >> 20} MiB] {name}: {med:.3f} s", file=sys.stderr, flush=True)
        isas = args.isas.split(",") if args.isas else [qcomm._C.cpu_isa()]
        rotations = {"off": [False], "on": [True], "both": [False, True]}[args.rotate]
        configs = []
        shadows = [0, args.shadow] if args.shadow else [0]
        groups = [int(g) for g in args.groups.split(",")]
        pieces = [int(m) for m in args.microshards.split(",")]
        for algo, bits, group, isa, rot, shadow, ms in itertools.product(
            args.algorithms.split(","),
            args.bits.split(","),
            groups,
            isas,
            rotations,
            shadows,
            pieces,
        ):
            rs, ag = (None if b == "none" else int(b) for b in bits.split("/"))
            what = f"{algo} [{isa}]" if args.isas else algo
            if len(groups) > 1 or group != 128:
                what += f" g{group}"
            if len(pieces) > 1:
                what += f" m{ms}"
            if args.rotate == "both":
                what += " rotated" if rot else ""
            if shadow:
                what += f" shadow={shadow}"
            cfg = qcomm.QuantConfig(
                algorithm=algo,
                rs_bits=rs,
                ag_bits=ag,
                min_bytes=0,
                microshards=ms,
                group_size=group,
                rotate=rot,
                tune=False,
                shadow=shadow,
                reduce_scatter=True,
                all_gather=True,
            )
            configs.append((what, bits, isa, cfg))
        if args.off:
            # qnccl with the collective's option unset: an exact pass-through to Gloo
            off = (
                qcomm.QuantConfig(algorithm="none")
                if what_call == "all_reduce"
                else qcomm.QuantConfig(min_bytes=0, tune=False)
            )
            configs.append(("qnccl off", "-", qcomm._C.cpu_isa(), off))

        def one_config(x, isa, cfg, rounds):
            qcomm.set_cpu_isa(isa)
            qcomm.set_config(cfg)
            before = qcomm.stats()["wire_bytes"]
            got = timed(lambda t: collective(what_call, t), x.clone, rounds)
            return got, (qcomm.stats()["wire_bytes"] - before) // rounds

        samples = {c[0] + c[1]: [] for c in configs}
        wires = {}
        if args.interleave:
            # every config once per round, round after round: drifts of a shared machine's load
            # reach every config alike
            # (Gloo's fp32 and bf16 baselines too, in the same rounds)
            base_dtype = dict(baselines)
            by_key = {c[0] + c[1]: c for c in configs}

            def measure(key, x=x, base_dtype=base_dtype, by_key=by_key, wires=wires):
                if key in base_dtype:
                    return qbench.timed_call(exact, gloo, lambda: x.to(base_dtype[key]))
                _what, _bits, isa, cfg = by_key[key]
                got, wires[key] = one_config(x, isa, cfg, 1)
                return got[0]

            keys = [name for name, _ in baselines] + [c[0] + c[1] for c in configs]
            got = qbench.interleave(keys, measure, args.iters, args.warmup)
            base_samples.update((name, got[name]) for name in base_dtype)
            samples.update((key, got[key]) for key in by_key)
        else:
            for what, bits, isa, cfg in configs:
                got, wires[what + bits] = one_config(x, isa, cfg, args.warmup + args.iters)
                samples[what + bits] = got[args.warmup :]
        for name, _ in baselines:
            if base_samples[name]:
                base[name], lo, hi = qbench.spread(base_samples[name])
                rows.append([size, name, "-", base[name], lo, hi, "", "", ""])
                if rank == 0:
                    print(f"[{size >> 20} MiB] {name}: {base[name]:.3f} s", file=sys.stderr)
        for what, bits, _isa, _cfg in configs:
            med, lo, hi = qbench.spread(samples[what + bits])
            rows.append(
                [
                    size,
                    what,
                    bits,
                    med,
                    lo,
                    hi,
                    base["gloo_fp32"] / med,
                    base["gloo_bf16"] / med,
                    wires[what + bits],
                ]
            )
            if rank == 0:
                print(
                    f"[{size >> 20} MiB] {what} {bits}: {med:.3f} s "
                    f"({base['gloo_fp32'] / med:.2f}x fp32, {base['gloo_bf16'] / med:.2f}x bf16)",
                    file=sys.stderr,
                    flush=True,
                )
    if rank == 0:
        head = [
            "bytes",
            "what",
            "bits",
            "median_s",
            "min_s",
            "max_s",
            "vs_fp32",
            "vs_bf16",
            "wire_bytes_per_rank",
        ]
        cells = [
            [
                str(r[0]),
                r[1],
                r[2],
                f"{r[3]:.3f}",
                f"{r[4]:.3f}",
                f"{r[5]:.3f}",
                f"{r[6]:.2f}x" if r[6] != "" else "",
                f"{r[7]:.2f}x" if r[7] != "" else "",
                str(r[8]),
            ]
            for r in rows
        ]
        print(qbench.md_table(head, cells))
        if args.csv:
            qbench.write_csv(args.csv, rows, head)
    dist.destroy_process_group()
    return 0


def _header(args) -> None:
    print(
        f"# {args.world} ranks in network namespaces, {args.rate} each way"
        + (f", +{args.delay} delay" if args.delay else "")
        + f", {args.threads} thread(s) per rank, {os.cpu_count()} cores",
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    qbench.add_cluster_args(ap, port=29577, timeout=1800)
    ap.add_argument("--sizes", default="64M")
    ap.add_argument(
        "--collective",
        default="all_reduce",
        choices=("all_reduce", "reduce_scatter", "all_gather"),
        help="the collective timed (a size is its message: the RS input, the AG output)",
    )
    ap.add_argument("--algorithms", default="two_step,ring,semi_ring")
    ap.add_argument("--bits", default="8/8,4/8,4/4")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument(
        "--microshards",
        default="4",
        help="QuantConfig(microshards=...) to time, e.g. 1,4,16 (side by side, labelled m<N>)",
    )
    ap.add_argument(
        "--groups", default="128", help="QuantConfig(group_size=...) to time, e.g. 32,128"
    )
    ap.add_argument(
        "--rotate",
        nargs="?",
        const="on",
        default="off",
        choices=("off", "on", "both"),
        help="QuantConfig(rotate=...): off, on (--rotate alone), or both, side by side",
    )
    ap.add_argument(
        "--shadow",
        type=int,
        default=0,
        help="also time every config with QuantConfig(shadow=N), side by side (0: not)",
    )
    ap.add_argument(
        "--off",
        action="store_true",
        help="add qnccl with the collective not quantized (the pass-through's own cost)",
    )
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="time the configs round-robin, one call each per round, instead of one after another",
    )
    ap.add_argument(
        "--isas",
        default="",
        help="CPU codec loops to time side by side, e.g. generic,avx512 (qcomm._C.cpu_isas(); "
        "default: only the one in use)",
    )
    ap.add_argument("--csv", default=None)
    return qbench.dispatch(ap, __file__, worker, before=_header)


if __name__ == "__main__":
    sys.exit(main())
