"""Throughput of the CUDA codec kernels as a fraction of the measured device-to-device copy
bandwidth (bytes read plus written), for messages of 64 MiB and up. Needs a GPU.

    python benchmarks/cuda_codec_bench.py --csv out.csv
    python benchmarks/cuda_codec_bench.py --csv out.csv --variants-csv variants.csv

First the default kernels at every size: the copy and each kernel timed in TURNS turns (copy,
kernel 1, ..., kernel 8, again), each one's faster turn kept, the copy's too, so the ratio to the
copy compares like with like. That table is printed and --csv written (the cost model reads it)
before any variant runs, so a variant that fails cannot take it down.

With --variants-csv, every kernel is then timed in the launch variants that the two launch
settings force (VARIANTS below: QCOMM_CUDA_ENCODE_BLOCKS=4, every encoder compiled for 4 blocks per
SM, by default only fp32 ones but the 8-bit asymmetric; QCOMM_CUDA_FULL_GRID=1, every block the
work needs for every kernel and size, by default only the decoders and the 4-block encoders from
10 Mi elements; 4 blocks with the full grid; QCOMM_CUDA_FULL_GRID=0 with
QCOMM_CUDA_ENCODE_BLOCKS=3, the resident grid and 3-block encoders, the default before
2026-11-30; csrc/cuda/tuning.h holds the defaults), in turns with the default in the same way,
and a second table gives them side by side, each row printed and written as it is done. The
extension reads its settings once per process, so every change of them is followed by
qcomm.reload_settings(). A timing that raises (a refused launch, a CUDA error) reads
"error" in its cells and the rest go on; the exit status is then 1.

Each timed region starts behind a queued torch.cuda._sleep, so the GPU runs the region's launches
back to back and the host's launch overhead is not timed.
"""

from __future__ import annotations

import argparse
import os
import sys

import qbench
import torch

import qcomm

# name, settings, the kernels it changes
VARIANTS = (
    ("4 blocks", {"QCOMM_CUDA_ENCODE_BLOCKS": "4"}, ("encode",)),
    ("full grid", {"QCOMM_CUDA_FULL_GRID": "1"}, ("encode", "decode")),
    (
        "4 blocks, full grid",
        {"QCOMM_CUDA_ENCODE_BLOCKS": "4", "QCOMM_CUDA_FULL_GRID": "1"},
        ("encode",),
    ),
    (
        "resident, 3 blocks",
        {"QCOMM_CUDA_FULL_GRID": "0", "QCOMM_CUDA_ENCODE_BLOCKS": "3"},
        ("encode", "decode"),
    ),
)
SETTINGS = sorted({k for _, env, _ in VARIANTS for k in env})
HEAD = ["MiB", "kernel", "bits", "scale", "time_us", "GB/s (read+write)", "x copy"]
TURNS = 2  # every time reported is the faster of two turns, the copy's as well as the kernels'
# About 5 ms at the H200's 1.98 GHz: longer than the host takes to queue a region's 21 launches
# (tens of microseconds each through Python), so they wait on the GPU and run back to back.
SLEEP_CYCLES = 10_000_000


def timed(fn, iters=20):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(SLEEP_CYCLES)  # the launches below queue behind it
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters / 1e3  # seconds


def timed_env(fn, env: dict[str, str], iters=20):
    """timed(fn) with exactly `env` of the variants' settings set; the extension's settings are
    reloaded after each change (it reads them once per process), the caller's restored after."""
    old = {k: os.environ.pop(k, None) for k in SETTINGS}
    os.environ.update(env)
    try:
        qcomm.reload_settings()
        return timed(fn, iters)
    finally:
        for k, v in old.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v
        qcomm.reload_settings()


def best_of(jobs):
    """Time each (name, fn, env) of `jobs` in TURNS turns (job 1, job 2, ..., again) and return
    each one's fastest time in seconds, or the exception it raised (not timed again)."""
    best = [None] * len(jobs)
    for _ in range(TURNS):
        for i, (name, fn, env) in enumerate(jobs):
            if isinstance(best[i], Exception):
                continue
            try:
                t = timed_env(fn, env)
            except Exception as e:  # noqa: BLE001 - reported, and "error" in its cells
                print(f"# {name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                best[i] = e
                continue
            best[i] = t if best[i] is None else min(best[i], t)
    return best


class Table:
    """A markdown table printed row by row, and its rows in a CSV file (when there is one), each
    flushed as it is added: a later failure keeps the rows before it."""

    def __init__(self, head, path):
        self.csv = qbench.CsvLog(path, head, dicts=False)
        print(qbench.md_head(head), flush=True)

    def add(self, row, echo=True, to_csv=True):
        if echo:
            print(qbench.md_row(row), flush=True)
        if to_csv:
            self.csv.add(row)

    def close(self):
        self.csv.close()


def codec_kernels(x):
    """(kernel, bits, scale, bytes read plus written, fn) of each codec kernel on x, fp32."""
    n = x.numel()
    out = []
    for bits in (8, 4):
        for sym in (False, True):
            enc = qcomm.codec.encode(x, bits, 128, sym)
            moved = n * 4 + enc.numel()  # bytes read plus written, either way
            scale = "sym" if sym else "asym"

            def encode(b=bits, s=sym):
                return qcomm.codec.encode(x, b, 128, s)

            def decode(e=enc, b=bits, s=sym):
                return qcomm.codec.decode(e, n, b, 128, s)

            out += [("encode", bits, scale, moved, encode), ("decode", bits, scale, moved, decode)]
    return out


def measured(t):
    return t is not None and not isinstance(t, Exception)


def us(t):
    return "error" if isinstance(t, Exception) else f"{t * 1e6:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes-mib", default="64,256,1024")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--variants-csv", default=None, help="also time the launch variants")
    args = ap.parse_args()
    if not (torch.cuda.is_available() and qcomm.compiled_with_cuda()):
        print("needs a CUDA device and the CUDA build of qcomm", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"# the default kernels; each time the faster of {TURNS} turns, the copy's too")
    errors = 0
    copy_bw = {}
    table = Table(HEAD, args.csv)
    for mib in sizes:
        x = torch.randn(mib * 2**20 // 4, device="cuda")
        y = torch.empty_like(x)
        kernels = codec_kernels(x)
        jobs = [(f"{mib} MiB copy", lambda x=x, y=y: y.copy_(x), {})]
        jobs += [(f"{mib} MiB {k} {b} {s}", fn, {}) for k, b, s, _, fn in kernels]
        copy_s, *times = best_of(jobs)
        if isinstance(copy_s, Exception):
            raise copy_s  # nothing to compare the kernels with
        copy_bw[mib] = 2 * x.numel() * 4 / copy_s
        table.add([mib, "copy", "-", "-", us(copy_s), f"{copy_bw[mib] / 1e9:.1f}", "1.00"])
        for (what, bits, scale, moved, _), t in zip(kernels, times):
            if isinstance(t, Exception):  # printed, but not a row the cost model would read
                errors += 1
                table.add([mib, what, bits, scale, "error", "error", "error"], to_csv=False)
            else:
                table.add([mib, what, bits, scale, us(t), f"{moved / t / 1e9:.1f}",
                           f"{moved / t / copy_bw[mib]:.2f}"])  # fmt: skip
        del x, y, kernels, jobs
    table.close()

    if args.variants_csv:
        var_head = ["MiB", "kernel", "bits", "scale", "time_us"]
        for name, _, _ in VARIANTS:
            var_head += [f"time_us {name}", f"speed-up {name}"]
        var_head += ["best x copy"]
        print("\nThe launch variants side by side with the default (same run, in turns; "
              "speed-up = default time / variant time; '-': the variant changes no such kernel; "
              "'error': that timing raised):")  # fmt: skip
        for name, env, _ in VARIANTS:
            print(f"  {name}: " + " ".join(f"{k}={v}" for k, v in env.items()))
        table = Table(var_head, args.variants_csv)
        names = ["default"] + [name for name, _, _ in VARIANTS]
        for mib in sizes:
            x = torch.randn(mib * 2**20 // 4, device="cuda")
            for what, bits, scale, moved, fn in codec_kernels(x):
                envs = [{}] + [env if what in k else None for _, env, k in VARIANTS]
                name = f"{mib} MiB {what} {bits} {scale}"
                jobs = [(f"{name} {v}", fn, e) for v, e in zip(names, envs) if e is not None]
                timings = iter(best_of(jobs))
                best = [None if e is None else next(timings) for e in envs]
                errors += sum(isinstance(b, Exception) for b in best)
                t = best[0]
                row = [mib, what, bits, scale, us(t)]
                for b in best[1:]:
                    if b is None:
                        row += ["-", "-"]
                    else:
                        row += [us(b), f"{t / b:.2f}" if measured(t) and measured(b) else "error"]
                ok = [(b, i) for i, b in enumerate(best) if measured(b)]
                row += [
                    f"{moved / min(ok)[0] / copy_bw[mib]:.2f} ({names[min(ok)[1]]})"
                    if ok
                    else "error"
                ]
                table.add(row)
            del x
        table.close()
    if errors:
        print(f"# {errors} timings raised (their cells read 'error')", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
