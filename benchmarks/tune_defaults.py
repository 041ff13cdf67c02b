"""qnccl with no settings against Gloo and against every fixed configuration the tuner chooses
from, on an emulated link (benchmarks/slow_cluster.py; --rate none: veth pairs with no limit).

Each rank joins four groups: the default group, qnccl with the defaults (QuantConfig(): `auto`
with the tuner; a fresh cache file, so each size class is measured at its first call and that
cost is reported), a Gloo group, a qnccl group whose config is switched to each fixed candidate
(algorithm x microshards, tune off), and a Gloo group for the barriers and timings. Per size,
after the first (tuning) call, every variant runs --iters times interleaved, one call of each in
turn; the time of a call is the maximum over ranks. Rank 0 prints one row per size: Gloo fp32,
the defaults and their choice, the best fixed configuration, and the ratios (above 1: faster than
Gloo): of the medians, and paired (the median and quartiles of each round's Gloo time over the
defaults' time, which share that round's load on a shared machine).

Needs root, but for --rate loopback (the ranks on this host over 127.0.0.1). Example:
    sudo .venv/bin/python benchmarks/tune_defaults.py --world 2 --rate none --sizes 256K,1M,64M

--cache-dir DIR: the defaults use the cache a user's run would, under DIR (XDG_CACHE_HOME=DIR: one
file per key, the network path included), kept between runs, instead of a fresh file; the first
call of a class then measures it (no entry) or checks it (an entry of this key from an earlier
run). --summary FILE appends one JSON line per size (rate, bytes, choice, ratios, tuning and check
seconds). benchmarks/tune_sequence.py runs the goals' sequence (loopback, 1 Gbit/s, loopback
again, one cache directory) with both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import qbench  # the namespaces and rate limits (as slow_cluster.py's), the timing, the tables


def worker(args) -> int:
    import torch
    import torch.distributed as dist

    import qcomm

    qbench.join(args, "qnccl", qcomm.QuantConfig())
    gloo = dist.new_group(backend="gloo")
    # barriers and the agreed times go over a group of their own, so that no variant shares its
    # connections with them (one that did ran up to 1.3x slower than the same fixed configuration)
    timing = dist.new_group(backend="gloo")
    fixed = dist.new_group(backend="qnccl", pg_options=qcomm.QuantConfig(tune=False))
    cands = [c for c in qcomm.tune_candidates(args.world) if c != "exact"]
    rows = []

    def once(fn, x):
        return qbench.timed_call(fn, timing, x.clone)

    def config(c):
        algo, shards = c.split("/")
        return qcomm.QuantConfig(algorithm=algo, microshards=int(shards), tune=False)

    for size in qbench.parse_sizes(args.sizes):
        x = torch.randn(size // 4, generator=torch.Generator().manual_seed(args.rank))
        before = qcomm.stats()
        first = once(lambda t: dist.all_reduce(t), x)
        after = qcomm.stats()
        tune_s = after["tune_seconds"] - before["tune_seconds"]
        check_s = after["check_seconds"] - before["check_seconds"]
        table = {e["bytes"]: e["choice"] for e in qcomm.tuning()}
        choice = table.get(size, "below min_bytes" if size < (1 << 20) else "?")

        def run(v, x=x):
            if v == "gloo":
                return once(lambda t: dist.all_reduce(t, group=gloo), x)
            if v == "default":
                return once(lambda t: dist.all_reduce(t), x)
            qcomm.set_config(config(v), group=fixed)
            return once(lambda t: dist.all_reduce(t, group=fixed), x)

        # each round starts with another variant, so that none is always first
        times = qbench.interleave(["gloo", "default"] + cands, run, args.iters, rotate=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        spread = {k: (min(v), max(v)) for k, v in times.items()}
        best = min(cands, key=lambda c: med[c])
        best_any = min(med["gloo"], med[best])
        # paired: the ratio of the two calls of one round, whose times share that round's load;
        # the median of those ratios and their quartiles
        paired = quartiles([g / d for g, d in zip(times["gloo"], times["default"])])
        rows.append(
            (
                size,
                med,
                spread,
                choice,
                best,
                tune_s,
                first,
                med["gloo"] / med["default"],
                best_any / med["default"],
                paired,
            )
        )
        if rank0(args) and args.summary:
            with open(args.summary, "a") as f:
                row = {
                    "rate": args.rate,
                    "bytes": size,
                    "choice": choice,
                    "gloo_ms": med["gloo"] * 1e3,
                    "defaults_ms": med["default"] * 1e3,
                    "vs_gloo": med["gloo"] / med["default"],
                    "paired": paired[1],
                    "best_fixed": best,
                    "vs_best": best_any / med["default"],
                    "tune_s": tune_s,
                    "check_s": check_s,
                    "retuned": after["retuned_classes"] - before["retuned_classes"],
                }
                f.write(json.dumps(row) + "\n")
        if rank0(args):
            print(
                f"[{size} B] gloo {med['gloo'] * 1e3:.2f} ms, default {med['default'] * 1e3:.2f} ms"
                f" ({choice}), best fixed {best} {med[best] * 1e3:.2f} ms; tuning {tune_s:.2f} s, "
                f"check {check_s * 1e3:.1f} ms; "
                + ", ".join(f"{c} {med[c] * 1e3:.2f}" for c in cands),
                file=sys.stderr,
                flush=True,
            )
    if rank0(args):
        head = ["bytes", "gloo fp32 ms", "defaults ms", "defaults chose", "best fixed"]
        head += ["best fixed ms", "defaults vs gloo", "paired (quartiles)"]
        head += ["defaults vs best of (gloo, fixed)", "tuning s"]
        cells = []
        for size, med, spread, choice, best, tune_s, _first, vs_gloo, vs_best, paired in rows:
            g, d = spread["gloo"], spread["default"]
            cells.append(
                [
                    size,
                    f"{med['gloo'] * 1e3:.2f} ({g[0] * 1e3:.2f}-{g[1] * 1e3:.2f})",
                    f"{med['default'] * 1e3:.2f} ({d[0] * 1e3:.2f}-{d[1] * 1e3:.2f})",
                    choice,
                    best,
                    f"{med[best] * 1e3:.2f}",
                    f"{vs_gloo:.2f}x",
                    f"{paired[1]:.2f}x ({paired[0]:.2f}-{paired[2]:.2f})",
                    f"{vs_best:.2f}x",
                    f"{tune_s:.2f}",
                ]
            )
        print(qbench.md_table(head, cells))
    dist.destroy_process_group()
    return 0


def quartiles(v):
    q = statistics.quantiles(v, n=4) if len(v) > 1 else [v[0]] * 3
    return q[0], statistics.median(v), q[2]


def rank0(args) -> bool:
    return args.rank == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    qbench.add_cluster_args(ap, port=29581, timeout=3600)
    ap.add_argument("--sizes", default="256K,1M,4M,16M,64M")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--cache-dir", default=None, help="the tuning cache's directory, kept")
    ap.add_argument("--summary", default=None, help="append one JSON line per size here")

    def before(args):
        if args.cache_dir:
            # the cache a user's run keeps, under this directory: a file per key
            os.environ.pop("QCOMM_TUNE_FILE", None)
            os.environ["XDG_CACHE_HOME"] = os.path.abspath(args.cache_dir)
        else:
            # a fresh cache: the first call of each class measures (its cost is reported)
            os.environ["QCOMM_TUNE_FILE"] = os.path.join(tempfile.mkdtemp(), "tune.json")
        os.environ.setdefault("QCOMM_TUNE", "1")
        print(
            f"# tune_defaults: {args.world} ranks, rate {args.rate}, {args.threads} thread(s) per "
            f"rank, {os.cpu_count()} cores, {args.iters} interleaved runs per variant",
            flush=True,
        )

    return qbench.dispatch(ap, __file__, worker, before)


if __name__ == "__main__":
    sys.exit(main())
