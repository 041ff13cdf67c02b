"""Throughput of the CUDA codec kernels as a fraction of the measured device-to-device copy
bandwidth (bytes read plus written), for messages of 64 MiB and up. Needs a GPU.

    python benchmarks/cuda_codec_bench.py --csv out.csv
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes-mib", default="64,256,1024")
    ap.add_argument("--csv", default=None)
    args = ap.parse_args()
    if not (torch.cuda.is_available() and qcomm.compiled_with_cuda()):
        print("needs a CUDA device and the CUDA build of qcomm", file=sys.stderr)
        return 2
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    rows = []
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
                t_enc = timed(lambda x=x, b=bits, s=sym: _C.cuda_codec_encode(x, b, 128, s))
                bw_enc = (x.numel() * 4 + enc.numel()) / t_enc
                t_dec = timed(
                    lambda e=enc, n=n, b=bits, s=sym: _C.cuda_codec_decode(e, n, b, 128, s)
                )
                bw_dec = (enc.numel() + x.numel() * 4) / t_dec
                for what, t, bw in (("encode", t_enc, bw_enc), ("decode", t_dec, bw_dec)):
                    rows.append(
                        [mib, what, bits, "sym" if sym else "asym", f"{t * 1e6:.1f}",
                         f"{bw / 1e9:.1f}", f"{bw / copy_bw:.2f}"]
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
