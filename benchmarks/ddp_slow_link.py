"""DDP training step time over a slow link: Gloo fp32, Gloo with DDP's bf16_compress_hook, qnccl
int8 and int4 (default algorithm), side by side in one run; and int8_blocking, qnccl int8 as it
ran before the CPU engine (each bucket's allreduce in the caller, so backward waits for it);
int8_defaults, qnccl int8 with `auto` tuned (off unless asked for: --variants), whose tuning cache
is a user's (~/.cache/qcomm) or, with --cache-dir DIR, the one a run of tune_defaults.py or of this
script with the same DIR left there (the goal: a cache written over another link does not slow it).

The cluster is slow_cluster.py's: N ranks, each in its own network namespace, a `tc tbf` limit of
--rate each way per rank. The model is an MLP of --layers x Linear(--width, --width) (default 4 x
2048: 16.8 M parameters, 67 MB of fp32 gradients, three DDP buckets of 25 MB). Each regime sets the
batch so that one step's compute alone (forward, backward, SGD step, no DDP) takes about its
target on rank 0 (communication-bound 0.05 s, middle 0.2 s, compute-bound 0.8 s by default); the
batch is shared with every rank.

Steps are interleaved: each round times one step of every variant and of the compute-only model,
after a barrier, as the slowest rank's time. Rank 0 prints, per regime, each variant's median step
time (min-max), its ratio to Gloo fp32's, to the bf16 hook's and to the compute-only step, the
CPU seconds the rank's process spent in the step (all its threads, the slowest rank's) and those
over the rank's share of the cores against the compute-only step (a step cannot end sooner than
its CPU work takes on its cores: the floor any overlap has on this machine), and writes --csv.

Needs root (ip netns, tc). Example:
    sudo .venv/bin/python benchmarks/ddp_slow_link.py --world 2 --rate 1gbit
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import qbench  # the namespaces and rate limits, the timing, the tables

VARIANTS = ("gloo", "bf16_hook", "int8", "int4", "int8_blocking")
EXTRA = ("int8_defaults",)


def _blocking_hook(group, bucket):
    """What qnccl did before its CPU engine: the allreduce runs in the caller, then the future is
    born complete (DDP's backward waits for each bucket)."""
    import torch
    import torch.distributed as dist

    buf = bucket.buffer()
    dist.all_reduce(buf, group=group)
    fut = torch.futures.Future()
    fut.set_result(buf.div_(group.size()))
    return fut


def _model(width: int, layers: int):
    import torch

    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods[:-1])


def worker(args) -> int:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    import qcomm

    rank, world = args.rank, args.world
    ctl = qbench.join(args)  # barriers and timings: never the groups timed
    groups = {
        "gloo": dist.new_group(backend="gloo"),
        "bf16_hook": dist.new_group(backend="gloo"),
        "int8": dist.new_group(
            backend="qnccl", pg_options=qcomm.QuantConfig(rs_bits=8, ag_bits=8, tune=False)
        ),
        "int4": dist.new_group(
            backend="qnccl", pg_options=qcomm.QuantConfig(rs_bits=4, ag_bits=4, tune=False)
        ),
        "int8_blocking": dist.new_group(
            backend="qnccl", pg_options=qcomm.QuantConfig(rs_bits=8, ag_bits=8, tune=False)
        ),
        "int8_defaults": dist.new_group(
            backend="qnccl", pg_options=qcomm.QuantConfig(rs_bits=8, ag_bits=8, tune=True)
        ),
    }
    variants = [v for v in args.variants.split(",") if v]
    params = sum(p.numel() for p in _model(args.width, args.layers).parameters())

    def compute_step(model, opt, x):
        opt.zero_grad(set_to_none=False)
        model(x).square().mean().backward()
        opt.step()

    # calibrate: a compute-only step's time as a + b * batch (two batch sizes, rank 0's fit,
    # shared), so that each regime's batch meets its target
    probe = _model(args.width, args.layers)
    popt = torch.optim.SGD(probe.parameters(), lr=1e-3)

    def step_time(n):
        xb = torch.randn(n, args.width)
        compute_step(probe, popt, xb)
        t0 = time.perf_counter()
        for _ in range(3):
            compute_step(probe, popt, xb)
        return (time.perf_counter() - t0) / 3

    t_lo, t_hi = step_time(32), step_time(256)
    fit = torch.tensor([(t_hi - t_lo) / 224, t_lo - 32 * (t_hi - t_lo) / 224], dtype=torch.float64)
    dist.broadcast(fit, 0, group=ctl)
    per_sample, fixed = float(fit[0]), float(fit[1])

    rows = []
    for regime in args.regimes.split(","):
        name, target = regime.split(":")
        batch = max(1, round((float(target) - fixed) / per_sample))
        x = torch.randn(batch, args.width, generator=torch.Generator().manual_seed(rank))
        models = {}
        for v in variants:
            m = _model(args.width, args.layers)
            ddp = DDP(m, process_group=groups[v])
            if v == "bf16_hook":
                ddp.register_comm_hook(groups[v], default_hooks.bf16_compress_hook)
            if v == "int8_blocking":
                ddp.register_comm_hook(groups[v], _blocking_hook)
            models[v] = (ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3))
        solo = _model(args.width, args.layers)
        models["compute_only"] = (solo, torch.optim.SGD(solo.parameters(), lr=1e-3))

        def measure(k, models=models, x=x):
            # [wall, CPU seconds of the rank's process (all its threads)], the slowest rank's
            m, opt = models[k]
            return qbench.timed_call(lambda: compute_step(m, opt, x), ctl, cpu=True)

        got = qbench.interleave(list(models), measure, args.steps, args.warmup)
        times = {k: [s[0] for s in v] for k, v in got.items()}
        cpu = {k: [s[1] for s in v] for k, v in got.items()}
        med = {k: statistics.median(v) for k, v in times.items()}
        for k, v in times.items():
            rows.append(
                {
                    "regime": name,
                    "batch": batch,
                    "variant": k,
                    "median_s": med[k],
                    "min_s": min(v),
                    "max_s": max(v),
                    "cpu_s": statistics.median(cpu[k]),
                    "vs_gloo": med[k] / med["gloo"] if "gloo" in med else float("nan"),
                    "vs_bf16_hook": med[k] / med["bf16_hook"]
                    if "bf16_hook" in med
                    else float("nan"),
                    "vs_compute": med[k] / med["compute_only"],
                }
            )
        if rank == 0:
            print(
                f"{name}: batch {batch}, compute-only step {med['compute_only']:.3f} s", flush=True
            )
    cores = (os.cpu_count() or 1) / world
    if rank == 0:
        print(
            f"# {world} ranks, {args.rate} each way, {params / 1e6:.1f} M parameters "
            f"({args.layers} x Linear({args.width}, {args.width})), {args.threads} thread(s) per "
            f"rank, {os.cpu_count()} cores; {args.steps} steps each (+{args.warmup} warm-up), "
            "interleaved; median (min-max) of the slowest rank's step"
        )
        head = ["regime", "batch", "variant", "step s", "vs Gloo fp32", "vs bf16 hook"]
        head += ["vs compute", "CPU s of a rank", f"CPU / {cores:g} core(s) a rank, vs compute"]
        cells = []
        for r in rows:
            compute_s = next(
                q["median_s"]
                for q in rows
                if q["regime"] == r["regime"] and q["variant"] == "compute_only"
            )
            cells.append(
                [
                    r["regime"],
                    r["batch"],
                    r["variant"],
                    f"{r['median_s']:.3f} ({r['min_s']:.3f}-{r['max_s']:.3f})",
                    f"{r['vs_gloo']:.2f}",
                    f"{r['vs_bf16_hook']:.2f}",
                    f"{r['vs_compute']:.2f}",
                    f"{r['cpu_s']:.3f}",
                    f"{r['cpu_s'] / cores / compute_s:.2f}",
                ]
            )
        print(qbench.md_table(head, cells))
        if args.csv:
            qbench.write_csv(args.csv, rows)
    for g in list(groups.values()) + [ctl]:
        dist.destroy_process_group(g)
    dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    qbench.add_cluster_args(ap, port=29581, timeout=3600)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument(
        "--regimes",
        default="comm:0.05,middle:0.2,compute:0.8",
        help="name:target seconds of one compute-only step, comma-separated",
    )
    ap.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"of {','.join(VARIANTS + EXTRA)}"
    )
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--csv", default=None)
    ap.add_argument(
        "--cache-dir", default=None, help="int8_defaults: the tuning cache's directory, kept"
    )

    def before(args):
        if args.cache_dir:  # the cache a user's run keeps, under this directory: a file per key
            os.environ.pop("QCOMM_TUNE_FILE", None)
            os.environ["XDG_CACHE_HOME"] = os.path.abspath(args.cache_dir)

    return qbench.dispatch(ap, __file__, worker, before)


if __name__ == "__main__":
    sys.exit(main())
