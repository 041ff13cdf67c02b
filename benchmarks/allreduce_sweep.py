"""Latency sweep of qnccl's quantized allreduce against Gloo's exact allreduce, on local CPU ranks.

    .venv/bin/python benchmarks/allreduce_sweep.py                      # defaults, ~2 min
    .venv/bin/python benchmarks/allreduce_sweep.py --sizes 1M,16M --bits 8/8 --iters 9

For each message size (default 4K, 16K, ..., 256M: powers of 4) it times, on --world spawned CPU
ranks over loopback (Gloo's TCP transport):

* ``gloo <dtype>``: Gloo's exact allreduce of the input in its own dtype (the first baseline);
* ``gloo bf16``: cast the input to bf16 (into a preallocated buffer), Gloo's allreduce of that, cast
  back into the input; its time includes both casts (the allreduce alone is reported under the
  table). Skipped when --dtype is bf16 (it would be the first baseline);
* every --algorithms x --bits pair of qnccl's quantized allreduce.

Each is measured as in ``python -m qcomm.bench`` (it reuses that module's runner): a fresh copy of
the same deterministic input per call, a barrier, one call timed on every rank, the max over ranks;
--warmup untimed calls, then --iters timed ones (--small-iters below --small-size, where calls are
cheap and noisy; at most --large-iters from --large-size on, to bound the run time). time_us is the
median of the timed calls, min_us/max_us their spread.
algbw = size/time and busbw = algbw*2(W-1)/W (nccl-tests' definitions); speedup_exact and
speedup_bf16 are the baselines' median times over this row's. wire_bytes: bytes rank 0 sent per call
(qnccl's counter; for the Gloo rows the nominal ring volume 2(W-1)/W of the message in the wire
dtype, not a measurement). rel_err = ||out - exact||_2 / ||exact||_2 and max_abs_err against the
float64 sum of all ranks' inputs, for the last call's output; identical: every call's output had
the same bits on every rank.

Output: the table on stdout, progress lines (count, elapsed, ETA) on stderr, the rows in a CSV
(--csv, written as rows finish) and PNG plots in --plot-dir: speedup_vs_size.png (speedup against
each baseline vs message size, one line per algorithm x bits), rel_err_vs_bits.png (relative error
vs bits, one line per algorithm, with the baselines' errors) and time_vs_size.png (latency curves).
The speedup plot shades the sizes whose exact baseline's max/min time ratio is above 5: there the
medians are mostly scheduling noise. --from-csv PATH redraws the table and plots of an earlier run.

The rank function, ``sweep_rank(rank, world, opts)``, only needs an initialised default process
group whose backend is qnccl, so another launcher (torchrun, ranks in network namespaces) can call
it.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # the spawned ranks inherit sys.path

from qcomm import bench  # noqa: E402

DEFAULT_SIZES = "4K,16K,64K,256K,1M,4M,16M,64M,256M"
DEFAULT_OUT = os.path.join(ROOT, "benchmarks", "out")
BASELINE = "gloo"
COLUMNS = [
    "size",
    "count",
    "dtype",
    "algorithm",
    "bits",
    "iters",
    "time_us",
    "min_us",
    "max_us",
    "algbw",
    "busbw",
    "wire_bytes",
    "speedup_exact",
    "speedup_bf16",
    "rel_err",
    "max_abs_err",
    "identical",
]
_LEFT = {"dtype", "algorithm", "bits", "identical"}
NOISY = 5  # plots shade sizes whose exact-baseline max/min time ratio is above this


# ---------------------------------------------------------------------------------------------
# options


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Latency sweep: qnccl's quantized allreduce vs Gloo's exact allreduce (input "
        "dtype and bf16) over message sizes, algorithms and bit widths, on local CPU ranks.",
    )
    p.add_argument("--world", type=int, default=2, help="number of ranks (default 2)")
    p.add_argument(
        "--sizes",
        type=bench.parse_sizes,
        default=bench.parse_sizes(DEFAULT_SIZES),
        help=f"message sizes in bytes, K/M/G = 2^10/2^20/2^30 (default {DEFAULT_SIZES})",
    )
    p.add_argument("--dtype", choices=sorted(bench.DTYPES), default="fp32", help="default fp32")
    p.add_argument(
        "--algorithms",
        type=bench.parse_algorithms,
        default=["two_step", "ring", "semi_ring"],
        help="comma-separated (default two_step,ring,semi_ring)",
    )
    bench.add_codec_args(p)
    p.add_argument(
        "--large-iters",
        type=int,
        default=5,
        help="at most this many timed calls per config from --large-size on, where one call takes "
        "up to a second (default 5)",
    )
    p.add_argument(
        "--large-size",
        type=bench.parse_size,
        default=bench.parse_size("256M"),
        help="sizes from this one on use --large-iters (default 256M)",
    )
    p.add_argument(
        "--small-iters",
        type=int,
        default=25,
        help="timed calls per config below --small-size, where one call is cheap and noisy; "
        "at least --iters (default 25)",
    )
    p.add_argument(
        "--small-size",
        type=bench.parse_size,
        default=bench.parse_size("1M"),
        help="sizes below this one use --small-iters (default 1M)",
    )
    bench.add_run_args(p)
    p.add_argument(
        "--csv",
        metavar="PATH",
        default=os.path.join(DEFAULT_OUT, "allreduce_sweep.csv"),
        help="CSV of the rows (default benchmarks/out/allreduce_sweep.csv; '' for none)",
    )
    p.add_argument(
        "--plot-dir",
        metavar="DIR",
        default=DEFAULT_OUT,
        help="folder for the PNG plots (default benchmarks/out; '' for none)",
    )
    p.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds before the run counts as hung"
    )
    p.add_argument(
        "--from-csv",
        metavar="PATH",
        default=None,
        help="measure nothing: print the table and draw the plots of a CSV this script wrote",
    )
    return p


def check_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if a.world < 2:
        p.error("--world must be at least 2")
    if min(a.iters, a.large_iters, a.small_iters) < 1:
        p.error("--iters, --large-iters and --small-iters must be at least 1")
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    if a.threads < 1:
        p.error("--threads must be at least 1")
    eb = bench.ELEM_BYTES[a.dtype]
    for s in a.sizes:
        if s % eb:
            p.error(f"size {s} is not a multiple of the {a.dtype} element size ({eb} bytes)")
    try:
        for algo in a.algorithms:
            for rs, ag in a.bits:
                bench.make_config(a, algo, rs, ag)
    except ValueError as e:
        p.error(str(e))


def iters_for(opts, size: int) -> int:
    if size >= opts.large_size:
        return min(opts.iters, opts.large_iters)
    if size < opts.small_size:
        return max(opts.iters, opts.small_iters)
    return opts.iters


def with_bf16_baseline(opts) -> bool:
    return opts.dtype != "bf16"


# ---------------------------------------------------------------------------------------------
# progress


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """Counts finished configurations; estimates the time left from the work done so far, each
    configuration weighted by its calls x max(size, 1 MiB) (small messages cost per-call
    latency)."""

    def __init__(self, opts):
        self.start = time.perf_counter()
        self.weights = []
        per_size = len(opts.algorithms) * len(opts.bits) + 1 + int(with_bf16_baseline(opts))
        for size in opts.sizes:
            w = (opts.warmup + iters_for(opts, size)) * max(size, 1 << 20)
            self.weights += [w] * per_size
        self.total = len(self.weights)
        self.done = 0
        self.done_weight = 0.0

    def step(self, what: str) -> None:
        self.done_weight += self.weights[self.done]
        self.done += 1
        elapsed = time.perf_counter() - self.start
        left = sum(self.weights[self.done :])
        eta = elapsed * left / self.done_weight if self.done_weight else 0.0
        print(
            f"[{self.done}/{self.total}] {what} | elapsed {_clock(elapsed)}, ETA {_clock(eta)}",
            file=sys.stderr,
            flush=True,
        )


# ---------------------------------------------------------------------------------------------
# the ranks


def sweep_rank(rank: int, world: int, opts, gloo=None) -> list:
    """Run the sweep on this rank. Call it on every rank of an initialised default process group
    whose backend is qnccl (imported qcomm; the group's config is replaced as the sweep goes).
    gloo: a Gloo group over the same ranks for the baseline, barriers and checks (made if None).
    Returns the rows (dicts) on rank 0, [] on the other ranks; rank 0 also writes opts.csv as rows
    finish and prints progress on stderr."""
    import torch.distributed as dist

    if gloo is None:
        gloo = dist.new_group(backend="gloo")
    sweep = _Sweep(rank, world, opts, gloo)
    try:
        for size in opts.sizes:
            sweep.run_size(size)
    finally:
        sweep.close()
    return sweep.rows


class _Sweep:
    """One rank's state: the runner, rank 0's CSV writer, progress and rows."""

    def __init__(self, rank, world, opts, gloo):
        self.rank, self.world, self.opts, self.gloo = rank, world, opts, gloo
        self.lead = rank == 0
        self.runner = bench._Runner(rank, world, gloo)
        self.progress = Progress(opts) if self.lead else None
        self.rows = []
        self.csv_file = self.writer = None
        if self.lead and opts.csv:
            os.makedirs(os.path.dirname(os.path.abspath(opts.csv)), exist_ok=True)
            self.csv_file = open(opts.csv, "w", newline="")
            self.writer = csv.DictWriter(self.csv_file, fieldnames=COLUMNS + ["allreduce_only_us"])
            self.writer.writeheader()

    def close(self):
        if self.csv_file is not None:
            self.csv_file.close()

    def run_size(self, size: int) -> None:
        import torch
        import torch.distributed as dist

        import qcomm

        opts, gloo, world = self.opts, self.gloo, self.world
        dtype = getattr(torch, bench.DTYPES[opts.dtype])
        count = size // bench.ELEM_BYTES[opts.dtype]
        iters = iters_for(opts, size)
        calls = opts.warmup + iters
        bus = 2 * (world - 1) / world
        inp = bench.make_input(opts.seed, self.rank, count, dtype)
        buf = torch.empty_like(inp)
        scratch = torch.empty_like(buf.view(torch.uint8))
        exact = None
        if self.lead:  # the float64 sum of every rank's input, regenerated from the seeds
            exact = inp.double()
            for r in range(1, world):
                exact += bench.make_input(opts.seed, r, count, dtype).double()
        dist.barrier(group=gloo)
        ctx = dict(size=size, count=count, iters=iters, buf=buf, exact=exact)

        # baseline 1: Gloo in the input dtype
        times, mism, _ = self.runner.run(inp, buf, scratch, gloo, opts.warmup, iters)
        exact_row = self._row(ctx, BASELINE, opts.dtype, times, mism, int(bus * size))
        base = {"exact": exact_row["time_us"]} if self.lead else {}
        done = [exact_row]

        # baseline 2: cast to bf16, Gloo allreduce, cast back (the allreduce alone timed too)
        if with_bf16_baseline(opts):
            half = torch.empty(count, dtype=torch.bfloat16)
            ar_times = []

            def bf16_allreduce(b):
                half.copy_(b)
                t0 = time.perf_counter()
                dist.all_reduce(half, group=gloo)
                ar_times.append(time.perf_counter() - t0)
                b.copy_(half)

            times, mism, _ = self.runner.run(
                inp, buf, scratch, gloo, opts.warmup, iters, call=bf16_allreduce
            )
            ar = torch.tensor(ar_times[opts.warmup :], dtype=torch.float64)
            dist.all_reduce(ar, op=dist.ReduceOp.MAX, group=gloo)
            row = self._row(ctx, BASELINE, "bf16", times, mism, int(bus * count * 2))
            if self.lead:
                row["allreduce_only_us"] = statistics.median(ar.tolist()) * 1e6
                base["bf16"] = row["time_us"]
            done.append(row)
            del half
        for row in done:
            self._finish(row, base)

        # the quantized allreduces
        for algo in opts.algorithms:
            for rs, ag in opts.bits:
                qcomm.set_config(bench.make_config(opts, algo, rs, ag))
                before = qcomm.stats()
                times, mism, _ = self.runner.run(inp, buf, scratch, None, opts.warmup, iters)
                after = qcomm.stats()
                wire = (after["wire_bytes"] - before["wire_bytes"]) // calls
                quantized = after["quantized_calls"] - before["quantized_calls"]
                row = self._row(ctx, algo, bench.bits_label((rs, ag)), times, mism, wire)
                note = "" if quantized == calls else f"; only {quantized}/{calls} quantized"
                self._finish(row, base, note)

    def _row(self, ctx, algorithm, bits, times, mism, wire):
        """The row of one measurement (rank 0; None elsewhere), errors from ctx's buf."""
        if not self.lead:
            return None
        t_us = statistics.median(times) * 1e6
        rel, mx = bench._errors(ctx["buf"], ctx["exact"])
        algbw = ctx["size"] / (t_us * 1e-6) / 1e9
        return dict(
            size=ctx["size"],
            count=ctx["count"],
            dtype=self.opts.dtype,
            algorithm=algorithm,
            bits=bits,
            iters=ctx["iters"],
            time_us=t_us,
            min_us=min(times) * 1e6,
            max_us=max(times) * 1e6,
            algbw=algbw,
            busbw=algbw * 2 * (self.world - 1) / self.world,
            wire_bytes=wire,
            rel_err=rel,
            max_abs_err=mx,
            identical=not mism,
            allreduce_only_us=None,
        )

    def _finish(self, row, base, note=""):
        if not self.lead:
            return
        row["speedup_exact"] = base["exact"] / row["time_us"]
        row["speedup_bf16"] = base["bf16"] / row["time_us"] if "bf16" in base else None
        self.rows.append(row)
        if self.writer is not None:
            self.writer.writerow(format_row(row, csv_form=True))
            self.csv_file.flush()
        sp = f"x{row['speedup_exact']:.2f} vs {self.opts.dtype}"
        if row["speedup_bf16"] is not None:
            sp += f", x{row['speedup_bf16']:.2f} vs bf16"
        self.progress.step(
            f"{bench.size_label(row['size'])} {row['algorithm']} {row['bits']}: "
            f"{row['time_us']:.1f} us ({sp}), rel_err {row['rel_err']:.2e}, "
            f"identical {'yes' if row['identical'] else 'NO'}{note}"
        )


# ---------------------------------------------------------------------------------------------
# output


def format_row(row: dict, csv_form: bool = False) -> dict:
    def opt(v, fmt):
        return "" if v is None else format(v, fmt)

    out = {
        "size": str(row["size"]),
        "count": str(row["count"]),
        "dtype": row["dtype"],
        "algorithm": row["algorithm"],
        "bits": row["bits"],
        "iters": str(row["iters"]),
        "time_us": f"{row['time_us']:.1f}",
        "min_us": f"{row['min_us']:.1f}",
        "max_us": f"{row['max_us']:.1f}",
        "algbw": f"{row['algbw']:.3f}",
        "busbw": f"{row['busbw']:.3f}",
        "wire_bytes": str(row["wire_bytes"]),
        "speedup_exact": opt(row["speedup_exact"], ".3f"),
        "speedup_bf16": opt(row["speedup_bf16"], ".3f") or "-",
        "rel_err": f"{row['rel_err']:.3e}",
        "max_abs_err": f"{row['max_abs_err']:.3e}",
        "identical": "yes" if row["identical"] else "no",
    }
    if csv_form:
        out["speedup_bf16"] = opt(row["speedup_bf16"], ".3f")
        out["allreduce_only_us"] = opt(row.get("allreduce_only_us"), ".1f")
    return out


def format_table(rows: list) -> str:
    lines = [[format_row(r)[c] for c in COLUMNS] for r in rows]
    # an empty line between sizes
    breaks = {i for i in range(1, len(rows)) if rows[i]["size"] != rows[i - 1]["size"]}
    return bench.align_table(COLUMNS, lines, _LEFT, breaks)


def header_lines(opts) -> list:
    cfg = bench.make_config(opts, opts.algorithms[0], *opts.bits[0])
    iters = f"iters={opts.iters}"
    other = []
    if any(iters_for(opts, s) != opts.iters for s in opts.sizes if s < opts.small_size):
        other.append(
            f"{iters_for(opts, 1)} below {bench.size_label(opts.small_size)}, where calls are "
            "cheap and noisy"
        )
    if any(iters_for(opts, s) < opts.iters for s in opts.sizes if s >= opts.large_size):
        other.append(
            f"{opts.large_iters} from {bench.size_label(opts.large_size)} on, to keep the run short"
        )
    if other:
        iters += " (" + "; ".join(other) + ")"
    return [
        "# allreduce_sweep: qnccl quantized allreduce vs Gloo exact allreduce "
        f"({opts.dtype} and bf16), local CPU ranks over loopback",
        *bench.system_lines(),
        "# load average at start " + " ".join(f"{x:.2f}" for x in os.getloadavg()),
        f"# world={opts.world} dtype={opts.dtype} threads/rank={opts.threads} {iters} "
        f"warmup={opts.warmup} group_size={cfg.group_size} symmetric={cfg.symmetric} "
        f"microshards={cfg.microshards} min_bytes=0 seed={opts.seed}",
        "# time_us: median over iters of the max over ranks (min_us/max_us: spread); "
        "algbw=size/time GB/s; busbw=algbw*2*(W-1)/W; speedup_X = gloo X time / this time",
        "# gloo bf16 = cast to bf16 + Gloo allreduce + cast back (its time includes the casts); "
        "wire_bytes of the gloo rows: nominal ring volume; errors vs the float64 sum",
    ]


def footer_lines(rows: list) -> list:
    out = []
    for r in rows:
        if r["algorithm"] == BASELINE and r.get("allreduce_only_us") is not None:
            casts = r["time_us"] - r["allreduce_only_us"]
            out.append(
                f"#   {bench.size_label(r['size'])}: gloo bf16 {r['time_us']:.1f} us = allreduce "
                f"{r['allreduce_only_us']:.1f} us + casts {casts:.1f} us"
            )
    if out:
        out.insert(0, "# the bf16 baseline without its casts (median of the allreduce alone):")
    return out


# ---------------------------------------------------------------------------------------------
# plots


def _size_ticks(ax, sizes):
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([bench.size_label(s) for s in sizes])
    ax.minorticks_off()


def plot(rows: list, opts, out_dir: str) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    quant = [r for r in rows if r["algorithm"] != BASELINE]
    sizes = sorted({r["size"] for r in rows})
    algos = list(dict.fromkeys(r["algorithm"] for r in quant))
    bits = list(dict.fromkeys(r["bits"] for r in quant))
    colors = {a: f"C{i}" for i, a in enumerate(algos)}
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D", "v"]
    style = {b: (styles[i % len(styles)], markers[i % len(markers)]) for i, b in enumerate(bits)}
    title = f"{opts.world} CPU ranks, loopback, {opts.dtype}"
    paths = []

    # (a) speedup vs message size
    noisy = sorted(
        r["size"]
        for r in rows
        if r["algorithm"] == BASELINE
        and r["bits"] == opts.dtype
        and r["max_us"] > NOISY * r["min_us"]
    )
    panels = [("speedup_exact", f"Gloo {opts.dtype}")]
    if any(r["speedup_bf16"] is not None for r in quant):
        panels.append(("speedup_bf16", "Gloo bf16 (incl. casts)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    for ax, (key, name) in zip(axes[0], panels):
        for a in algos:
            for b in bits:
                pts = sorted(
                    (r["size"], r[key]) for r in quant if r["algorithm"] == a and r["bits"] == b
                )
                if pts:
                    ls, mk = style[b]
                    ax.plot(*zip(*pts), ls, marker=mk, color=colors[a], label=f"{a} {b}", ms=4)
        ax.axhline(1.0, color="k", lw=0.8)
        for i, size in enumerate(noisy):  # shade the sizes whose timings are mostly noise
            j = sizes.index(size)
            lo = (sizes[j - 1] * size) ** 0.5 if j > 0 else size / 2
            hi = (sizes[j + 1] * size) ** 0.5 if j + 1 < len(sizes) else size * 2
            label = f"Gloo {opts.dtype} max/min > {NOISY}x (noisy)" if i == 0 else None
            ax.axvspan(lo, hi, color="0.88", lw=0, zorder=0, label=label)
        _size_ticks(ax, sizes)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(f"speedup vs {name} (time ratio)")
        ax.set_title(f"speedup vs {name}")
        ax.grid(True, which="major", alpha=0.3)
    axes[0][-1].legend(fontsize=7, ncol=1, loc="best")
    fig.suptitle(f"qnccl quantized allreduce: speedup vs message size ({title})")
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "speedup_vs_size.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    # (b) relative error vs bits (median over sizes, bars: min..max over sizes)
    def wire_bits(label):
        return sum(int(x) if x.isdigit() else 32 for x in label.split("/"))

    order = sorted(bits, key=wire_bits)
    fig, ax = plt.subplots(figsize=(6.5, 4.8))
    for i, a in enumerate(algos):
        xs, med, lo, hi = [], [], [], []
        for j, b in enumerate(order):
            errs = [r["rel_err"] for r in quant if r["algorithm"] == a and r["bits"] == b]
            if not errs:
                continue
            m = statistics.median(errs)
            xs.append(j + (i - (len(algos) - 1) / 2) * 0.06)
            med.append(m)
            lo.append(m - min(errs))
            hi.append(max(errs) - m)
        ax.errorbar(xs, med, yerr=[lo, hi], marker="o", color=colors[a], label=a, capsize=3)
    lowest = min((r["rel_err"] for r in quant if r["rel_err"] > 0), default=0.0)
    off_scale = []
    for r_bits, ls in dict([("bf16", "--"), (opts.dtype, ":")]).items():
        errs = [r["rel_err"] for r in rows if r["algorithm"] == BASELINE and r["bits"] == r_bits]
        errs = [e for e in errs if e > 0]
        if not errs:
            continue
        m = statistics.median(errs)
        if lowest and m < lowest / 1000:  # would squash the quantized errors: name it instead
            off_scale.append(f"Gloo {r_bits}: {m:.1e}, off scale")
            continue
        ax.axhline(m, color="k", ls=ls, lw=0.9, label=f"Gloo {r_bits} ({m:.1e})")
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels([f"{b} bits" for b in order])
    ax.set_yscale("log")
    ax.set_xlabel("rs/ag bits")
    ax.set_ylabel("relative L2 error vs float64 sum")
    note = "; ".join(["median over sizes, bars min..max"] + off_scale)
    ax.set_title(f"relative error vs bits ({title};\n{note})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "rel_err_vs_bits.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    # (c) latency curves
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for r_bits, ls in dict([("bf16", "--"), (opts.dtype, "-")]).items():
        pts = sorted(
            (r["size"], r["time_us"])
            for r in rows
            if r["algorithm"] == BASELINE and r["bits"] == r_bits
        )
        if pts:
            ax.plot(*zip(*pts), ls, color="k", lw=2, label=f"Gloo {r_bits}")
        if r_bits == opts.dtype:  # the spread of the first baseline: how noisy a size is
            band = sorted(
                (r["size"], r["min_us"], r["max_us"])
                for r in rows
                if r["algorithm"] == BASELINE and r["bits"] == r_bits
            )
            if band:
                xs, lo, hi = zip(*band)
                ax.fill_between(
                    xs, lo, hi, color="k", alpha=0.1, lw=0, label=f"Gloo {r_bits} min..max"
                )
    for a in algos:
        for b in bits:
            pts = sorted(
                (r["size"], r["time_us"]) for r in quant if r["algorithm"] == a and r["bits"] == b
            )
            if pts:
                ls, mk = style[b]
                ax.plot(*zip(*pts), ls, marker=mk, color=colors[a], label=f"{a} {b}", ms=4)
    _size_ticks(ax, sizes)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("time (us, median, max over ranks)")
    ax.set_title(f"allreduce latency ({title})")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "time_vs_size.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def read_csv(path: str) -> list:
    """The rows of a CSV written by this script, with their types back."""
    ints = {"size", "count", "iters", "wire_bytes"}
    text = {"dtype", "algorithm", "bits", "identical"}
    rows = []
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            row = {}
            for k, v in rec.items():
                if k in text:
                    row[k] = v
                elif v == "":
                    row[k] = None
                else:
                    row[k] = int(v) if k in ints else float(v)
            row["identical"] = rec["identical"] == "yes"
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# the parent


def main(argv=None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    check_args(parser, opts)

    import qcomm
    from qcomm.spawn import run_ranks

    if opts.from_csv:
        rows = read_csv(opts.from_csv)
        if rows:  # the plots' titles name the dtype (from the rows) and --world
            opts.dtype = rows[0]["dtype"]
        print(f"# rows of {opts.from_csv}")
        print(format_table(rows))
        for line in footer_lines(rows):
            print(line)
        if opts.plot_dir:
            for path in plot(rows, opts, opts.plot_dir):
                print(f"# plot: {path}")
        return 0

    print("\n".join(header_lines(opts)), flush=True)
    t0 = time.perf_counter()
    results = run_ranks(
        sweep_rank,
        opts.world,
        opts,
        backend=qcomm.BACKEND,
        pg_options=bench.make_config(opts, opts.algorithms[0], *opts.bits[0]),
        timeout=opts.timeout,
        threads=opts.threads,
        env={"OMP_NUM_THREADS": str(opts.threads)},
    )
    rows = results[0]
    elapsed = time.perf_counter() - t0
    print(format_table(rows), flush=True)
    for line in footer_lines(rows):
        print(line)
    if opts.csv:
        print(f"# csv: {opts.csv}")
    if opts.plot_dir:
        for path in plot(rows, opts, opts.plot_dir):
            print(f"# plot: {path}")
    ok = all(r["identical"] for r in rows)
    if not ok:
        print("# FAIL: some outputs were not bit-identical across ranks")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"# {len(rows)} rows in {_clock(elapsed)} (m:ss); load average at the end {load}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
