"""The main job (bash scripts/run_bench.sh): qnccl's quantized allreduce timed and checked against
an exact Gloo allreduce on CPU ranks.

    python benchmarks/allreduce_bench.py [--world 2] [--sizes 1M,16M,64M] [--dtype fp32] \
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
stderr, one line per finished configuration. The measurement itself (inputs, runner, errors) is the
benchmarks library's (benchmarks/qbench), shared with allreduce_sweep.py.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

import qbench

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


def build_parser() -> argparse.ArgumentParser:
    """The command line of the main job (--help prints it)."""
    p = argparse.ArgumentParser(
        description="Time and check qnccl's quantized allreduce against an exact Gloo allreduce "
        "on spawned CPU ranks.",
    )
    p.add_argument("--world", type=int, default=2, help="number of ranks (default 2)")
    p.add_argument(
        "--sizes",
        type=qbench.parse_sizes,
        default=qbench.parse_sizes("1M,16M,64M"),
        help="message sizes in bytes, K/M/G = 2^10/2^20/2^30 (default 1M,16M,64M)",
    )
    p.add_argument("--dtype", choices=sorted(qbench.DTYPES), default="fp32", help="default fp32")
    p.add_argument(
        "--algorithms",
        type=qbench.parse_algorithms,
        default=["two_step", "ring", "semi_ring"],
        help="comma-separated (default two_step,ring,semi_ring)",
    )
    qbench.add_codec_args(p)
    qbench.add_run_args(p)
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
    qbench.check_run_args(p, a)
    try:  # validate every knob up front, not in the ranks
        for algo in a.algorithms:
            for rs, ag in a.bits:
                qbench.make_config(a, algo, rs, ag)
    except ValueError as e:
        p.error(str(e))


def machine_lines(a) -> list:
    """The header lines of the results: the machine, the run's settings, the columns' meaning."""
    cfg = qbench.make_config(a, a.algorithms[0], *a.bits[0])
    return [
        "# allreduce_bench: qnccl quantized allreduce vs exact gloo allreduce (CPU ranks)",
        *qbench.system_lines(),
        f"# world={a.world} dtype={a.dtype} threads/rank={a.threads} iters={a.iters} "
        f"warmup={a.warmup} group_size={cfg.group_size} symmetric={cfg.symmetric} "
        f"microshards={cfg.microshards} min_bytes=0 seed={a.seed}",
        "# time_us/exact_us: median over iters of the max over ranks; algbw=size/time GB/s; "
        "busbw=algbw*2*(W-1)/W; wire_bytes: sent by rank 0 per call; errors vs the float64 sum",
    ]


def fmt_row(row: dict) -> dict:
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


def format_table(rows: list) -> str:
    """The result rows as the aligned table the main job prints."""
    lines = [[fmt_row(r)[c] for c in COLUMNS] for r in rows]
    return qbench.align_table(COLUMNS, lines, {"dtype", "algorithm", "bits", "identical"})


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def worker(rank, world, a, init_file, reports):
    """One rank of the main job (qbench.spawn's worker): rank 0 prints, writes the CSV and reports
    ("done", whether every output was bit-identical across ranks)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(a.threads)
    import qcomm

    dtype = getattr(torch, qbench.DTYPES[a.dtype])
    first_cfg = qbench.make_config(a, a.algorithms[0], *a.bits[0])
    dist.init_process_group(
        qcomm.BACKEND,
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=a.timeout),
        pg_options=first_cfg,
    )
    gloo = dist.new_group(backend="gloo")
    runner = qbench.Runner(rank, world, gloo)
    lead = rank == 0
    start = time.perf_counter()

    if lead:
        print("\n".join(machine_lines(a)), flush=True)
    out = qbench.CsvLog(a.csv if lead else None, COLUMNS)

    rows = []
    total = len(a.sizes) * len(a.algorithms) * len(a.bits)
    done = 0
    all_identical = True
    eb = qbench.ELEM_BYTES[a.dtype]
    try:
        for size in a.sizes:
            count = size // eb
            inp = qbench.make_input(a.seed, rank, count, dtype)
            buf = torch.empty_like(inp)
            scratch = torch.empty_like(qbench.bytes_view(buf))
            exact = None
            if lead:  # the float64 sum of every rank's input, regenerated from the seeds
                exact = inp.double()
                for r in range(1, world):
                    exact += qbench.make_input(a.seed, r, count, dtype).double()
            dist.barrier(group=gloo)

            # exact baseline: gloo allreduce of the same tensor in its dtype
            times, mism, changed = runner.run(inp, buf, scratch, gloo, a.warmup, a.iters)
            exact_us = statistics.median(times) * 1e6
            if mism:
                all_identical = False
            if lead:
                rel, mx = qbench.errors(buf, exact)
                _log(
                    f"[base] {qbench.size_label(size)} gloo exact {a.dtype}: {exact_us:.1f} us, "
                    f"rel_err {rel:.2e}, identical {'yes' if not mism else 'NO'}"
                    + (" (output changed between calls)" if changed else "")
                    + f" ({time.perf_counter() - start:.1f} s)"
                )

            for algo in a.algorithms:
                for rs, ag in a.bits:
                    cfg = qbench.make_config(a, algo, rs, ag)
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
                    rel, mx = qbench.errors(buf, exact)
                    algbw = size / (t_us * 1e-6) / 1e9
                    bits = qbench.bits_label((rs, ag))
                    row = dict(
                        size=size,
                        count=count,
                        dtype=a.dtype,
                        algorithm=algo,
                        bits=bits,
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
                    out.add(fmt_row(row))
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
                        f"[{done}/{total}] {qbench.size_label(size)} {algo} {bits}: "
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
            reports.put(("done", all_identical))
    finally:
        out.close()
    dist.destroy_process_group()


def main(argv=None) -> int:
    """The main job's entry point (scripts/run_bench.sh): spawns the ranks, runs every
    configuration against Gloo's exact allreduce, prints the table; 0 on success."""
    parser = build_parser()
    a = parser.parse_args(argv)
    check_args(parser, a)

    # the ranks' OpenMP pools are sized when torch loads in the child, so say it before spawning
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    try:
        reports = qbench.spawn(worker, a.world, a, prefix="qcomm-bench-")
    except qbench.RankFailed as e:  # a rank raised or died; the others were terminated
        print(f"allreduce_bench: a rank failed: {e}", file=sys.stderr)
        return 3
    if not reports:
        print("allreduce_bench: rank 0 ended without reporting", file=sys.stderr)
        return 3
    if not reports[-1][1]:
        print(
            "allreduce_bench: FAIL: some output was not bit-identical across ranks", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
