"""Throughput of the CUDA codec kernels as a fraction of the measured device-to-device copy
bandwidth (bytes read plus written), for messages of 64 MiB and up. Needs a GPU.

    python benchmarks/cuda_codec_bench.py --csv out.csv
    python benchmarks/cuda_codec_bench.py --csv out.csv --prefetch-csv prefetch.csv

With --prefetch-csv, every encode and decode is also timed with QCOMM_CUDA_PREFETCH=1 (the
kernels prefetch their next slab or step into L2), alternating with the default in the same run
(A, B, A, B; the faster of each pair's two timings), and a second table gives both side by side.
The main table and --csv stay the default kernels' (what the cost model reads).
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


def timed_env(fn, value: str | None, iters=20):
    """timed(fn) with QCOMM_CUDA_PREFETCH set to value (None: unset); read at every launch."""
    old = os.environ.pop("QCOMM_CUDA_PREFETCH", None)
    if value is not None:
        os.environ["QCOMM_CUDA_PREFETCH"] = value
    try:
        return timed(fn, iters)
    finally:
        os.environ.pop("QCOMM_CUDA_PREFETCH", None)
        if old is not None:
            os.environ["QCOMM_CUDA_PREFETCH"] = old


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes-mib", default="64,256,1024")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--prefetch-csv", default=None, help="also time QCOMM_CUDA_PREFETCH=1")
    args = ap.parse_args()
    if not (torch.cuda.is_available() and qcomm.compiled_with_cuda()):
        print("needs a CUDA device and the CUDA build of qcomm", file=sys.stderr)
        return 2
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows, pf_rows = [], []
    for mib in (int(s) for s in args.sizes_mib.split(",")):
        n = mib * 2**20 // 4
        x = torch.randn(n, device="cuda")
        y = torch.empty_like(x)
        copy_s = timed(lambda x=x, y=y: y.copy_(x))
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
                    if args.prefetch_csv:
                        pairs = [(timed_env(fn, None), timed_env(fn, "1")) for _ in range(2)]
                        t = min(a for a, _ in pairs)
                        t_pf = min(b for _, b in pairs)
                        pf_rows.append(
                            [mib, what, bits, "sym" if sym else "asym", f"{t * 1e6:.1f}",
                             f"{t_pf * 1e6:.1f}", f"{moved / t / copy_bw:.2f}",
                             f"{moved / t_pf / copy_bw:.2f}", f"{t / t_pf:.2f}"]
                        )  # fmt: skip
                    else:
                        t = timed_env(fn, None)
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
    if args.prefetch_csv:
        pf_head = ["MiB", "kernel", "bits", "scale", "time_us", "time_us prefetch", "x copy",
                   "x copy prefetch", "speed-up"]  # fmt: skip
        print("\nQCOMM_CUDA_PREFETCH=1 side by side with the default (same run, alternating):")
        print("| " + " | ".join(pf_head) + " |")
        print("|" + "---|" * len(pf_head))
        for r in pf_rows:
            print("| " + " | ".join(str(c) for c in r) + " |")
        with open(args.prefetch_csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(pf_head)
            w.writerows(pf_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
