"""The goals' sequence for `auto` (issue 39): qnccl's defaults against Gloo, run in order with one
shared tuning cache directory: on loopback, then over an emulated 1 Gbit/s link, then on loopback
again (benchmarks/tune_defaults.py each time, --cache-dir and --summary), then one table of the
ratios per size and run (above 1: the defaults faster than Gloo), with each run's choice and what
its first call of the class cost (a tuning, or the check of a cached entry).

The goals: the 1 Gbit/s run at least 1.5x, 2.0x, 2.5x and 3.4x Gloo at 1, 4, 16 and 64 MiB; the
second loopback run at least 0.95x Gloo at every size from 1 MiB.

Needs root for the 1 Gbit/s run (network namespaces). Run it on a quiet machine:
    sudo .venv/bin/python benchmarks/tune_sequence.py --sizes 1M,4M,16M,64M
--rates chooses the sequence (default loopback,1gbit,loopback); without root, only loopback runs
can be made (loopback,loopback: the second one checks the first one's cache).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import qbench

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rates", default="loopback,1gbit,loopback")
    ap.add_argument("--sizes", default="1M,4M,16M,64M")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache-dir", default=None, help="default: a fresh temporary directory")
    args = ap.parse_args()
    cache = args.cache_dir or tempfile.mkdtemp(prefix="qcomm-tune-seq-")
    out = tempfile.mkdtemp(prefix="qcomm-tune-seq-")
    rates = args.rates.split(",")
    print(f"# tune_sequence: {' then '.join(rates)}; cache directory {cache}", flush=True)
    runs = {}
    for i, rate in enumerate(rates, 1):
        summary = os.path.join(out, f"run{i}.jsonl")
        cmd = [
            sys.executable,
            os.path.join(HERE, "tune_defaults.py"),
            "--world",
            str(args.world),
            "--rate",
            rate,
            "--sizes",
            args.sizes,
            "--iters",
            str(args.iters),
            "--threads",
            str(args.threads),
            "--cache-dir",
            cache,
            "--summary",
            summary,
        ]
        print(f"# run {i}: {' '.join(cmd[1:])}", flush=True)
        code = subprocess.call(cmd)
        if code != 0:
            print(f"tune_sequence: run {i} ({rate}) failed with {code}", file=sys.stderr)
            return code
        with open(summary) as f:
            runs[i] = [json.loads(line) for line in f]
    heads = [f"run {i} {rates[i - 1]}" for i in sorted(runs)]
    print(qbench.md_head(["bytes"] + heads))
    for size in sorted({r["bytes"] for rs in runs.values() for r in rs}):
        cells = []
        for i in sorted(runs):
            r = next((r for r in runs[i] if r["bytes"] == size), None)
            if r is None:
                cells.append("-")
                continue
            first = (
                f"tuned {r['tune_s']:.2f} s"
                if r["tune_s"]
                else f"checked {r['check_s'] * 1e3:.0f} ms"
            )
            cells.append(
                f"{r['vs_gloo']:.2f}x (paired {r['paired']:.2f}x), {r['choice']}, {first}"
                + (f", re-tuned {r['retuned']}" if r["retuned"] else "")
            )
        print(qbench.md_row([size] + cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
