"""The main job, a command-line entry point (not part of the runtime API): qnccl's quantized
allreduce timed and checked against an exact Gloo allreduce on CPU ranks.

    python -m qcomm.bench [--world 2] [--sizes 1M,16M,64M] [--dtype fp32] \
        [--algorithms two_step,ring,semi_ring] [--bits 8/8,4/8,4/4] [--group-size 128] \
        [--symmetric] [--iters 5] [--warmup 1] [--threads 1] [--csv out.csv]

It spawns --world CPU ranks (torch.multiprocessing, spawn) joined through a file:// store. The
default group is qnccl (``QuantConfig(min_bytes=0, ...)``, so every size quantizes); a second, plain
Gloo group over the same ranks carries the exact baseline, the barriers, the timing reductions and
the cross-rank comparisons. For each size, every rank draws a deterministic input (seeded randn, one
seed per rank and size); rank 0 regenerates all ranks' inputs to form the exact float64 sum. Then,
for each algorithm and rs/ag bits pair (switched with ``qcomm.set_config`` on every rank):

* each call starts from a fresh copy of the input, after a barrier; its time is the max over ranks
  (an allreduce MAX through the Gloo group), and time_us is the median over --iters timed calls
  (after --warmup untimed ones); exact_us is the same measurement of a Gloo allreduce of the same
  tensor in its dtype;
* every call's output (warmup included) is compared bit for bit across ranks: rank 0's output is
  broadcast through the Gloo group and compared with each rank's own; the "identical" column says
  whether all of them matched, and the run exits with status 1 if any did not;
* wire_bytes is what rank 0 sent per call (the delta of ``qcomm.stats()['wire_bytes']`` over the
  calls, divided by their number); rel_err = ||out - exact||_2 / ||exact||_2 and max_abs_err are
  against the float64 exact sum, for the last call's output.

Rank 0 prints the machine (CPU model, cores), the torch version and the settings first, the table
on stdout at the end (and, with --csv, the same rows to a CSV file as they finish); progress goes to
stderr, one line per finished configuration.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
ELEM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
COLUMNS = [
    "size",
    "count",
    "dtype",
    "algorithm",
    "bits",
    "time_us",
    "exact_us",
    "speedup",
    "algbw",
    "busbw",
    "wire_bytes",
    "rel_err",
    "max_abs_err",
    "identical",
]
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


# ---------------------------------------------------------------------------------------------
# argument parsing


def parse_size(text: str) -> int:
    """'256K' -> 262144, '4M' -> 4194304, '1G', '4096' (bytes); K/M/G are powers of 1024."""
    m = re.fullmatch(r"\s*(\d+)\s*([KkMmGg]?)(?:i?[Bb])?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use bytes like 4096, 256K, 4M or 1G")
    n = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if n <= 0:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: must be positive")
    return n


def parse_sizes(text: str) -> list:
    """'1M,16M' -> [1048576, 16777216] (parse_size of each)."""
    return [parse_size(t) for t in text.split(",") if t.strip()]


def _parse_bits_one(text: str):
    t = text.strip().lower()
    if t in ("none", "-", "0", "raw"):
        return None
    if t in ("4", "8"):
        return int(t)
    raise argparse.ArgumentTypeError(f"bad bits {text!r}: use 4, 8 or none")


def parse_bits(text: str) -> list:
    """'8/8,4/8,4/4' -> [(8, 8), (4, 8), (4, 4)]; '8' means 8/8; 'none' ships the input dtype."""
    out = []
    for tok in text.split(","):
        tok = tok.strip()
        if not tok:
            continue
        parts = tok.split("/")
        if len(parts) == 1:
            parts = parts * 2
        if len(parts) != 2:
            raise argparse.ArgumentTypeError(f"bad bits pair {tok!r}: use RS/AG like 4/8")
        out.append((_parse_bits_one(parts[0]), _parse_bits_one(parts[1])))
    if not out:
        raise argparse.ArgumentTypeError("--bits is empty")
    return out


def parse_algorithms(text: str) -> list:
    """'two_step,ring' -> ['two_step', 'ring'], each checked against qcomm.ALGORITHMS."""
    from .config import ALGORITHMS

    algos = [a.strip().lower() for a in text.split(",") if a.strip()]
    for a in algos:
        if a not in ALGORITHMS:
            allowed = ", ".join(ALGORITHMS)
            raise argparse.ArgumentTypeError(f"bad algorithm {a!r}; allowed: {allowed}")
    if not algos:
        raise argparse.ArgumentTypeError("--algorithms is empty")
    return algos


def bits_label(pair) -> str:
    """(4, None) -> '4/none'."""
    return "/".join("none" if b is None else str(b) for b in pair)


def size_label(n: int) -> str:
    """1048576 -> '1M': the largest binary unit that divides n, else the number."""
    for unit in ("G", "M", "K"):
        if n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


def add_codec_args(p: argparse.ArgumentParser) -> None:
    """The codec and timing options the main job and benchmarks/allreduce_sweep.py share."""
    p.add_argument(
        "--bits",
        type=parse_bits,
        default=parse_bits("8/8,4/8,4/4"),
        help="rs/ag bit pairs, each 4, 8 or none (default 8/8,4/8,4/4)",
    )
    p.add_argument("--group-size", type=int, default=128, help="elements per scale (default 128)")
    p.add_argument("--symmetric", action="store_true", help="absmax scaling (default min/max)")
    p.add_argument(
        "--microshards", type=int, default=None, help="pieces per chunk (QuantConfig default)"
    )
    p.add_argument("--iters", type=int, default=5, help="timed calls per config (default 5)")


def add_run_args(p: argparse.ArgumentParser) -> None:
    """Warm-up, threads and seed, shared likewise."""
    p.add_argument("--warmup", type=int, default=1, help="untimed calls first (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--seed", type=int, default=1234, help="base seed of the inputs (default 1234)")


def build_parser() -> argparse.ArgumentParser:
    """The command line of python -m qcomm.bench (--help prints it)."""
    p = argparse.ArgumentParser(
        prog="python -m qcomm.bench",
        description="Time and check qnccl's quantized allreduce against an exact Gloo allreduce "
        "on spawned CPU ranks.",
    )
    p.add_argument("--world", type=int, default=2, help="number of ranks (default 2)")
    p.add_argument(
        "--sizes",
        type=parse_sizes,
        default=parse_sizes("1M,16M,64M"),
        help="message sizes in bytes, K/M/G = 2^10/2^20/2^30 (default 1M,16M,64M)",
    )
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32", help="default fp32")
    p.add_argument(
        "--algorithms",
        type=parse_algorithms,
        default=["two_step", "ring", "semi_ring"],
        help="comma-separated (default two_step,ring,semi_ring)",
    )
    add_codec_args(p)
    add_run_args(p)
    p.add_argument("--csv", metavar="PATH", default=None, help="also write the rows to this CSV")
    p.add_argument(
        "--timeout", type=float, default=600.0, help="collective timeout in seconds (default 600)"
    )
    return p


def check_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Refuses, through the parser's error, what the ranks could not run, before they start."""
    if a.world < 2:
        p.error("--world must be at least 2")
    if a.iters < 1:
        p.error("--iters must be at least 1")
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    if a.threads < 1:
        p.error("--threads must be at least 1")
    eb = ELEM_BYTES[a.dtype]
    for s in a.sizes:
        if s % eb:
            p.error(f"size {s} is not a multiple of the {a.dtype} element size ({eb} bytes)")
    try:  # validate every knob up front, not in the ranks
        for algo in a.algorithms:
            for rs, ag in a.bits:
                make_config(a, algo, rs, ag)
    except ValueError as e:
        p.error(str(e))


def make_config(a, algo, rs, ag):
    """The QuantConfig of one row: the command line's codec knobs, min_bytes 0."""
    from .config import QuantConfig

    kw = dict(
        algorithm=algo,
        rs_bits=rs,
        ag_bits=ag,
        group_size=a.group_size,
        symmetric=bool(a.symmetric),
        min_bytes=0,
    )
    if a.microshards is not None:
        kw["microshards"] = a.microshards
    return QuantConfig(**kw)


# ---------------------------------------------------------------------------------------------
# machine description


def cpu_model() -> str:
    """This machine's CPU model name, for the header of the results."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def system_lines() -> list:
    """'# machine: ...' and '# torch ...' lines describing where a benchmark ran."""
    import torch

    import qcomm

    logical = os.cpu_count() or 0
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = logical
    return [
        f"# machine: {cpu_model()}, {logical} logical cores ({usable} usable), "
        f"{platform.system()} {platform.release()} {platform.machine()}",
        f"# torch {torch.__version__}, python {platform.python_version()}, "
        f"qcomm CUDA kernels compiled: {qcomm.compiled_with_cuda()}",
    ]


def machine_lines(a) -> list:
    """The header lines of the results: the machine, the run's settings, the columns' meaning."""
    cfg = make_config(a, a.algorithms[0], *a.bits[0])
    return [
        "# qcomm.bench: qnccl quantized allreduce vs exact gloo allreduce (CPU ranks)",
        *system_lines(),
        f"# world={a.world} dtype={a.dtype} threads/rank={a.threads} iters={a.iters} "
        f"warmup={a.warmup} group_size={cfg.group_size} symmetric={cfg.symmetric} "
        f"microshards={cfg.microshards} min_bytes=0 seed={a.seed}",
        "# time_us/exact_us: median over iters of the max over ranks; algbw=size/time GB/s; "
        "busbw=algbw*2*(W-1)/W; wire_bytes: sent by rank 0 per call; errors vs the float64 sum",
    ]


# ---------------------------------------------------------------------------------------------
# the ranks


def _seed(base: int, rank: int, count: int) -> int:
    return (base * 1_000_003 + rank * 7_919 + count * 104_729) % (1 << 62)


def make_input(base_seed: int, rank: int, count: int, dtype):
    """Rank `rank`'s input of `count` N(0,1) elements in `dtype`, the same for the same seed."""
    import torch

    g = torch.Generator().manual_seed(_seed(base_seed, rank, count))
    return torch.randn(count, generator=g, dtype=torch.float32).to(dtype)


def _bytes_view(t):
    """The raw bytes of t (uint8, which Gloo broadcasts for every dtype; int16 it does not)."""
    import torch

    return t.view(torch.uint8)


class _Runner:
    """What one rank needs to time and check one configuration."""

    def __init__(self, rank, world, gloo):
        self.rank, self.world, self.gloo = rank, world, gloo

    def run(self, inp, buf, scratch, group, warmup, iters, call=None):
        """warmup + iters allreduces of a fresh copy of inp; returns (max-over-ranks times of the
        timed calls in seconds, number of calls whose output differed across ranks, whether this
        rank's output changed between calls). call(buf), when given, is timed instead of
        ``dist.all_reduce(buf, SUM, group)`` (e.g. a cast to bf16, an allreduce and a cast back);
        it must leave its result in buf."""
        import torch
        import torch.distributed as dist

        times = []
        mismatches = 0
        first = None
        changed = False
        for i in range(warmup + iters):
            buf.copy_(inp)
            dist.barrier(group=self.gloo)
            t0 = time.perf_counter()
            if call is None:
                dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group)
            else:
                call(buf)
            t1 = time.perf_counter()
            if i >= warmup:
                times.append(t1 - t0)
            # bit-identical across ranks: broadcast rank 0's bits, compare with ours
            bits = _bytes_view(buf)
            if self.rank == 0:
                scratch.copy_(bits)
            dist.broadcast(scratch, src=0, group=self.gloo)
            if not torch.equal(scratch, bits):
                mismatches += 1
            # and across calls on this rank (same input, same config)
            if first is None:
                first = bits.clone()
            elif not torch.equal(first, bits):
                changed = True
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.gloo)
        flags = torch.tensor([mismatches, int(changed)], dtype=torch.int64)
        dist.all_reduce(flags, op=dist.ReduceOp.SUM, group=self.gloo)
        return t.tolist(), int(flags[0]), int(flags[1])


def _errors(out, exact):
    d = out.double() - exact
    en = float(exact.norm())
    rel = float(d.norm()) / en if en > 0 else float("nan")
    return rel, float(d.abs().max())


def _fmt_row(row: dict) -> dict:
    """The printed (and CSV) form of a row."""
    return {
        "size": str(row["size"]),
        "count": str(row["count"]),
        "dtype": row["dtype"],
        "algorithm": row["algorithm"],
        "bits": row["bits"],
        "time_us": f"{row['time_us']:.1f}",
        "exact_us": f"{row['exact_us']:.1f}",
        "speedup": f"{row['speedup']:.3f}",
        "algbw": f"{row['algbw']:.3f}",
        "busbw": f"{row['busbw']:.3f}",
        "wire_bytes": str(row["wire_bytes"]),
        "rel_err": f"{row['rel_err']:.3e}",
        "max_abs_err": f"{row['max_abs_err']:.3e}",
        "identical": "yes" if row["identical"] else "no",
    }


def align_table(columns: list, lines: list, left: set, breaks=()) -> str:
    """Columns aligned (the names in `left` to the left), a rule under the header, and an empty
    line before each data line whose index is in `breaks`."""
    cells = [columns] + lines
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    out = []
    for n, line in enumerate(cells):
        if n - 1 in breaks:
            out.append("")
        out.append(
            "  ".join(
                v.ljust(w) if columns[i] in left else v.rjust(w)
                for i, (v, w) in enumerate(zip(line, widths))
            ).rstrip()
        )
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def format_table(rows: list) -> str:
    """The result rows as the aligned table the main job prints."""
    lines = [[_fmt_row(r)[c] for c in COLUMNS] for r in rows]
    return align_table(COLUMNS, lines, {"dtype", "algorithm", "bits", "identical"})


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _worker(rank, world, a, init_file, status_q):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(a.threads)
    import qcomm

    dtype = getattr(torch, DTYPES[a.dtype])
    first_cfg = make_config(a, a.algorithms[0], *a.bits[0])
    dist.init_process_group(
        qcomm.BACKEND,
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=a.timeout),
        pg_options=first_cfg,
    )
    gloo = dist.new_group(backend="gloo")
    runner = _Runner(rank, world, gloo)
    lead = rank == 0
    start = time.perf_counter()

    if lead:
        print("\n".join(machine_lines(a)), flush=True)
    csv_file = writer = None
    if lead and a.csv:
        csv_file = open(a.csv, "w", newline="")
        writer = csv.DictWriter(csv_file, fieldnames=COLUMNS)
        writer.writeheader()
        csv_file.flush()

    rows = []
    total = len(a.sizes) * len(a.algorithms) * len(a.bits)
    done = 0
    all_identical = True
    eb = ELEM_BYTES[a.dtype]
    try:
        for size in a.sizes:
            count = size // eb
            inp = make_input(a.seed, rank, count, dtype)
            buf = torch.empty_like(inp)
            scratch = torch.empty_like(_bytes_view(buf))
            exact = None
            if lead:  # the float64 sum of every rank's input, regenerated from the seeds
                exact = inp.double()
                for r in range(1, world):
                    exact += make_input(a.seed, r, count, dtype).double()
            dist.barrier(group=gloo)

            # exact baseline: gloo allreduce of the same tensor in its dtype
            times, mism, changed = runner.run(inp, buf, scratch, gloo, a.warmup, a.iters)
            exact_us = statistics.median(times) * 1e6
            if mism:
                all_identical = False
            if lead:
                rel, mx = _errors(buf, exact)
                _log(
                    f"[base] {size_label(size)} gloo exact {a.dtype}: {exact_us:.1f} us, "
                    f"rel_err {rel:.2e}, identical {'yes' if not mism else 'NO'}"
                    + (" (output changed between calls)" if changed else "")
                    + f" ({time.perf_counter() - start:.1f} s)"
                )

            for algo in a.algorithms:
                for rs, ag in a.bits:
                    cfg = make_config(a, algo, rs, ag)
                    qcomm.set_config(cfg)
                    before = qcomm.stats()
                    times, mism, changed = runner.run(inp, buf, scratch, None, a.warmup, a.iters)
                    after = qcomm.stats()
                    calls = a.warmup + a.iters
                    quantized = after["quantized_calls"] - before["quantized_calls"]
                    wire = (after["wire_bytes"] - before["wire_bytes"]) // calls
                    t_us = statistics.median(times) * 1e6
                    done += 1
                    if mism:
                        all_identical = False
                    if not lead:
                        continue
                    rel, mx = _errors(buf, exact)
                    algbw = size / (t_us * 1e-6) / 1e9
                    row = dict(
                        size=size,
                        count=count,
                        dtype=a.dtype,
                        algorithm=algo,
                        bits=bits_label((rs, ag)),
                        time_us=t_us,
                        exact_us=exact_us,
                        speedup=exact_us / t_us,
                        algbw=algbw,
                        busbw=algbw * 2 * (world - 1) / world,
                        wire_bytes=wire,
                        rel_err=rel,
                        max_abs_err=mx,
                        identical=not mism,
                    )
                    rows.append(row)
                    if writer is not None:
                        writer.writerow(_fmt_row(row))
                        csv_file.flush()
                    notes = []
                    if quantized != calls:
                        notes.append(
                            f"only {quantized}/{calls} calls quantized: {qcomm.plan(buf)['reason']}"
                        )
                    if mism:
                        notes.append(f"OUTPUT DIFFERS ACROSS RANKS in {mism}/{calls} calls")
                    if changed:
                        notes.append("output changed between calls")
                    _log(
                        f"[{done}/{total}] {size_label(size)} {algo} {bits_label((rs, ag))}: "
                        f"{t_us:.1f} us (exact {exact_us:.1f} us, x{exact_us / t_us:.2f}), "
                        f"wire {wire} B, rel_err {rel:.2e}, identical {'yes' if not mism else 'NO'}"
                        + "".join(f"; {n}" for n in notes)
                        + f" ({time.perf_counter() - start:.1f} s)"
                    )
            del inp, buf, scratch, exact
        if lead:
            print(format_table(rows), flush=True)
            if a.csv:
                print(f"# csv: {a.csv}", flush=True)
            if not all_identical:
                print("# FAIL: some outputs were not bit-identical across ranks", flush=True)
            _log(f"done: {total} configs in {time.perf_counter() - start:.1f} s")
            status_q.put(("done", all_identical))
    finally:
        if csv_file is not None:
            csv_file.close()
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# the parent


def main(argv=None) -> int:
    """The main job's entry point (python -m qcomm.bench, scripts/run_bench.sh): spawns the ranks,
    runs every configuration against Gloo's exact allreduce, prints the table; 0 on success."""
    parser = build_parser()
    a = parser.parse_args(argv)
    check_args(parser, a)

    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    # the ranks' OpenMP pools are sized when torch loads in the child, so say it before spawning
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    # pickled by module name, so the children import qcomm.bench (not this __main__)
    worker = importlib.import_module("qcomm.bench")._worker
    tmp = tempfile.mkdtemp(prefix="qcomm-bench-")
    ctx = mp.get_context("spawn")
    status_q = ctx.SimpleQueue()
    try:
        pc = mp.start_processes(
            worker,
            args=(a.world, a, os.path.join(tmp, "store"), status_q),
            nprocs=a.world,
            join=False,
            start_method="spawn",
        )
        try:
            while not pc.join():
                pass
        except ProcessException as e:  # a rank raised or died; the others were terminated
            print(f"qcomm.bench: a rank failed: {e}", file=sys.stderr)
            return 3
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    status = None
    while not status_q.empty():
        status = status_q.get()
    if status is None:
        print("qcomm.bench: rank 0 ended without reporting", file=sys.stderr)
        return 3
    if not status[1]:
        print("qcomm.bench: FAIL: some output was not bit-identical across ranks", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
