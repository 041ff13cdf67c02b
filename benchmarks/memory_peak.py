"""Peak extra memory of a quantized allreduce, as a multiple of the input, for large messages.

Each rank allocates and touches its input, records its resident set, runs one allreduce per
algorithm, and reports the growth of its peak resident set (ru_maxrss) over that baseline, plus
the result's relative error against the exact sum and whether every rank holds the same bits.

    .venv/bin/python benchmarks/memory_peak.py --size 1G --world 2
    .venv/bin/python benchmarks/memory_peak.py --size 1G --dtype bf16   # 16-bit inputs
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

import qbench
import torch
import torch.distributed as dist

import qcomm


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    """Reset VmHWM (the peak resident set) to the current resident set (Linux 4.0+)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _worker(rank, world, numel, algos, bits, dtype):
    torch.set_num_threads(1)
    gloo = dist.new_group(backend="gloo")
    rows = []
    for algo in algos:
        qcomm.set_config(
            qcomm.QuantConfig(algorithm=algo, rs_bits=bits[0], ag_bits=bits[1], min_bytes=0)
        )
        x = torch.randn(numel, generator=torch.Generator().manual_seed(rank)).to(dtype)
        exact = x.to(torch.float32, copy=True)
        dist.all_reduce(exact, group=gloo)  # fp32 Gloo sum as the reference
        # the buffers an earlier algorithm's call left (kept for the next call) would hide this
        # one's: each call allocates afresh
        qcomm.release_buffers()
        _reset_peak()
        base = _status_mib("VmRSS")
        t0 = time.perf_counter()
        dist.all_reduce(x)
        seconds = time.perf_counter() - t0
        extra = max(0.0, _status_mib("VmHWM") - base)
        rel = float((x.float() - exact).norm() / exact.norm())
        digest = hashlib.sha1(x.view(torch.uint8).numpy().tobytes()).hexdigest()
        digests = [None] * world
        dist.all_gather_object(digests, digest, group=gloo)
        rows.append((algo, extra, seconds, rel, len(set(digests)) == 1))
        del x, exact
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size", default="1G", help="message bytes per rank, e.g. 256M, 1G")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--algorithms", default="two_step,ring,semi_ring")
    ap.add_argument("--bits", default="8/8")
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    args = ap.parse_args()
    dtype = DTYPES[args.dtype]
    elem = torch.tensor([], dtype=dtype).element_size()
    numel = qbench.parse_size(args.size) // elem
    bits = tuple(None if b == "none" else int(b) for b in args.bits.split("/"))
    algos = args.algorithms.split(",")
    input_mib = numel * elem / 2**20
    print(f"# {args.world} ranks, {input_mib:.0f} MiB {args.dtype} per rank, bits {args.bits}")
    results = qbench.run_ranks(
        _worker, args.world, numel, algos, bits, dtype, timeout=3600, start_method="forkserver"
    )
    print("algorithm  peak_extra_MiB(max over ranks)  x_input  seconds  rel_err   identical")
    ok = True
    for i, algo in enumerate(algos):
        extra = max(r[i][1] for r in results)
        secs = max(r[i][2] for r in results)
        rel = results[0][i][3]
        same = all(r[i][4] for r in results)
        ok &= same
        print(
            f"{algo:<10} {extra:>30.0f}  {extra / input_mib:>7.2f}  {secs:>7.2f}  {rel:.2e}  "
            f"{'yes' if same else 'NO'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
