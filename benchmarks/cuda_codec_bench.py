"""Throughput of the CUDA codec kernels as a fraction of the measured device-to-device copy
bandwidth (bytes read plus written), for messages of 64 MiB and up. Needs a GPU.

    python benchmarks/cuda_codec_bench.py --csv out.csv
    python benchmarks/cuda_codec_bench.py --csv out.csv --variants-csv variants.csv

With --variants-csv, every kernel is also timed in the launch variants that are read at every
launch (VARIANTS below: QCOMM_CUDA_PREFETCH=1, the kernels prefetching their next slab or step
into L2; QCOMM_CUDA_ENCODE_BLOCKS=4, the encoders compiled for 4 blocks per SM; both;
QCOMM_CUDA_ENCODE_STAGED=1, the encoders staging their next slab in shared memory), in turns
with the default in the same run (default, variant 1, ..., twice; the faster of each one's two
timings), and a second table gives them side by side. The main table and --csv stay the default
kernels' (what the cost model reads).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import qcomm  # noqa: E402
from qcomm import _C  # noqa: E402

# name, settings, the kernels it changes
VARIANTS = (
    ("prefetch", {"QCOMM_CUDA_PREFETCH": "1"}, ("encode", "decode")),
    ("4 blocks", {"QCOMM_CUDA_ENCODE_BLOCKS": "4"}, ("encode",)),
    ("both", {"QCOMM_CUDA_PREFETCH": "1", "QCOMM_CUDA_ENCODE_BLOCKS": "4"}, ("encode",)),
    ("staged", {"QCOMM_CUDA_ENCODE_STAGED": "1"}, ("encode",)),
)
SETTINGS = sorted({k for _, env, _ in VARIANTS for k in env})


def timed(fn, iters=20):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters / 1e3  # seconds


def timed_env(fn, env: dict[str, str], iters=20):
    """timed(fn) with exactly `env` of the variants' settings set (read at every launch)."""
    old = {k: os.environ.pop(k, None) for k in SETTINGS}
    os.environ.update(env)
    try:
        return timed(fn, iters)
    finally:
        for k, v in old.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes-mib", default="64,256,1024")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--variants-csv", default=None, help="also time the launch variants")
    args = ap.parse_args()
    if not (torch.cuda.is_available() and qcomm.compiled_with_cuda()):
        print("needs a CUDA device and the CUDA build of qcomm", file=sys.stderr)
        return 2
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows, var_rows = [], []
    for mib in (int(s) for s in args.sizes_mib.split(",")):
        n = mib * 2**20 // 4
        x = torch.randn(n, device="cuda")
        y = torch.empty_like(x)
        copy_s = timed_env(lambda x=x, y=y: y.copy_(x), {})
        copy_bw = 2 * x.numel() * 4 / copy_s
        rows.append([mib, "copy", "-", "-", f"{copy_s * 1e6:.1f}", f"{copy_bw / 1e9:.1f}", "1.00"])
        for bits in (8, 4):
            for sym in (False, True):
                enc = _C.cuda_codec_encode(x, bits, 128, sym)
                moved = x.numel() * 4 + enc.numel()  # bytes read plus written, either way
                kernels = (
                    ("encode", lambda x=x, b=bits, s=sym: _C.cuda_codec_encode(x, b, 128, s)),
                    ("decode", lambda e=enc, n=n, b=bits, s=sym: _C.cuda_codec_decode(e, n, b, 128, s)),
                )  # fmt: skip
                for what, fn in kernels:
                    if args.variants_csv:
                        envs = [{}] + [env if what in k else None for _, env, k in VARIANTS]
                        turns = [[timed_env(fn, e) if e is not None else None for e in envs]
                                 for _ in range(2)]  # fmt: skip
                        best = [None if t[0] is None else min(t) for t in zip(*turns)]
                        t = best[0]
                        row = [mib, what, bits, "sym" if sym else "asym", f"{t * 1e6:.1f}"]
                        for b in best[1:]:
                            row += ["-", "-"] if b is None else [f"{b * 1e6:.1f}", f"{t / b:.2f}"]
                        names = ["default"] + [name for name, _, _ in VARIANTS]
                        fastest = min((b, i) for i, b in enumerate(best) if b is not None)
                        row += [f"{moved / fastest[0] / copy_bw:.2f} ({names[fastest[1]]})"]
                        var_rows.append(row)
                    else:
                        t = timed_env(fn, {})
                    rows.append(
                        [mib, what, bits, "sym" if sym else "asym", f"{t * 1e6:.1f}",
                         f"{moved / t / 1e9:.1f}", f"{moved / t / copy_bw:.2f}"]
                    )  # fmt: skip
    head = ["MiB", "kernel", "bits", "scale", "time_us", "GB/s (read+write)", "x copy"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(head)
            w.writerows(rows)
    if args.variants_csv:
        var_head = ["MiB", "kernel", "bits", "scale", "time_us"]
        for name, _, _ in VARIANTS:
            var_head += [f"time_us {name}", f"speed-up {name}"]
        var_head += ["best x copy"]
        print("\nThe launch variants side by side with the default (same run, in turns; "
              "speed-up = default time / variant time; '-': the variant changes no such kernel):")  # fmt: skip
        for name, env, _ in VARIANTS:
            print(f"  {name}: " + " ".join(f"{k}={v}" for k, v in env.items()))
        print("| " + " | ".join(var_head) + " |")
        print("|" + "---|" * len(var_head))
        for r in var_rows:
            print("| " + " | ".join(str(c) for c in r) + " |")
        with open(args.variants_csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(var_head)
            w.writerows(var_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
