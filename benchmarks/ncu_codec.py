"""The codec kernels under Nsight Compute (ncu): where their time goes, from hardware counters.

The timing benchmark (cuda_codec_bench.py) says how fast the kernels are against a copy; this says
why: each kernel's duration alone, its DRAM throughput as a share of the chip's peak, the
occupancy it achieved against what its registers allow, and what its warps wait for (the average
cycles a warp spends stalled per issued instruction, by reason; "long_scoreboard" is waiting for
global memory, "barrier" and "membar" for synchronisation, "math_pipe_throttle" for arithmetic).

Two steps, both run by scripts/gpu_check.sh:

    ncu --clock-control none --print-units base --csv --page raw --log-file raw.csv \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum \\
        -k 'regex:encodeKernel|decodeKernel|vectorized_elementwise_kernel' \\
        python benchmarks/ncu_codec.py run --mib 64
    python benchmarks/ncu_codec.py report raw.csv [ncu.log ...]

`run` (needs a GPU and the CUDA build) launches each codec kernel once on an fp32 tensor of
--mib MiB (groups of 128), the encoders also as compiled for 3 and for 4 blocks per SM
(QCOMM_CUDA_ENCODE_BLOCKS=3, 4; by default fp32 takes 4 but for the 8-bit asymmetric codec,
csrc/cuda/tuning.h), and a streaming elementwise kernel of torch's (y = x + 0: 4 bytes read
and 4 written per element) as the reference for what a plain stream reaches. `report` reads ncu's
raw CSV page (one row per profiled kernel, a row of units under the header; numbers may carry
thousands separators) and prints one markdown table; it needs no GPU. Given several files it reads
the first that holds profiled kernels (ncu writes its CSV to --log-file, or else to stdout).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import sys

STALL = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
KERNEL = re.compile(r"\b(encode|decode)Kernel<([^<>]*)>")


def run(mib: int) -> int:
    import qbench  # noqa: F401  (this checkout's qcomm first on sys.path)
    import torch

    import qcomm

    if not (torch.cuda.is_available() and qcomm.compiled_with_cuda()):
        print("needs a CUDA device and the CUDA build of qcomm", file=sys.stderr)
        return 2
    n = mib * 2**20 // 4
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    torch.add(x, 0, out=y)  # the streaming reference
    for bits in (8, 4):
        for sym in (False, True):
            enc = qcomm.codec.encode(x, bits, 128, sym)
            qcomm.codec.decode(enc, n, bits, 128, sym)
            # the encoder compiled for 3 and for 4 blocks per SM (one of them the default); the
            # extension reads its settings once per process, so they are reloaded at each change
            old = os.environ.pop("QCOMM_CUDA_ENCODE_BLOCKS", None)
            for value in ("3", "4"):
                os.environ["QCOMM_CUDA_ENCODE_BLOCKS"] = value
                qcomm.reload_settings()
                qcomm.codec.encode(x, bits, 128, sym)
            del os.environ["QCOMM_CUDA_ENCODE_BLOCKS"]
            if old is not None:
                os.environ["QCOMM_CUDA_ENCODE_BLOCKS"] = old
            qcomm.reload_settings()
    torch.cuda.synchronize()
    print(f"ran the codec kernels once each on {mib} MiB of fp32, the encoders in three variants")
    return 0


def number(text: str) -> float | None:
    t = text.strip().replace(",", "")
    try:
        return float(t)
    except ValueError:
        return None


def template_args(kernel: str) -> tuple[str, list[str]] | None:
    """("encode" or "decode", the template arguments) of a codec kernel's demangled name:
    encodeKernel<T, bits, sym, blocks>, decodeKernel<bits, sym> (before 2026-12-01 also a staged
    flag and the decoder's unroll, which ncu logs of then carry); bools as true/false whether the
    demangler writes `8, false` or `(int)8, (bool)0`. None for other kernels."""
    m = KERNEL.search(kernel)
    if not m:
        return None
    bools = {"(bool)1": "true", "(bool)0": "false"}
    args = [a.strip() for a in m.group(2).split(",")]
    return m.group(1), [bools.get(a, re.sub(r"^\(int\)", "", a)) for a in args]


def label(kernel: str) -> str:
    """ "encode 8-bit asym, 3 blocks/SM" from encodeKernel<T, bits, sym, blocks>; "decode 4-bit
    sym" from decodeKernel<bits, sym>. The names of before 2026-12-01 (ncu logs of the removed
    variants) label as then: ", staged" from encodeKernel<..., blocks, staged>, ", 8 items per
    thread" from decodeKernel<bits, sym, unroll> where not 4."""
    parsed = template_args(kernel)
    if parsed:
        kind, args = parsed
        if kind == "encode":
            args = args[1:]  # the input type
        sym = "sym" if args[1] == "true" else "asym"
        if kind == "decode":
            unroll = f", {args[2]} items per thread" if len(args) > 2 and args[2] != "4" else ""
            return f"decode {args[0]}-bit {sym}{unroll}"
        blocks = f", {args[2]} blocks/SM" if len(args) > 2 else ""
        staged = ", staged" if len(args) > 3 and args[3] == "true" else ""
        return f"{kind} {args[0]}-bit {sym}{blocks}{staged}"
    if "vectorized_elementwise" in kernel:
        return "stream (x + 0)"
    return kernel[:40]


# ncu scales units for display unless told --print-units base; either way the units row says
# which: values are brought to nanoseconds and bytes
SCALE = {
    "nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9,
    "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
    "KB": 1e3, "MB": 1e6, "GB": 1e9,
}  # fmt: skip


def read_raw(text: str) -> list[dict[str, str]]:
    """The kernels' rows of ncu's raw CSV page, values in nanoseconds and bytes: the lines before
    its header (ncu's ==PROF== lines, the program's output) are skipped, and the units row under
    the header (whose ID is not a number) gives each column's unit."""
    lines = text.splitlines()
    start = next(
        (
            i
            for i, line in enumerate(lines)
            if line.lstrip('"').startswith("ID") and "Kernel Name" in line
        ),
        None,
    )
    if start is None:
        return []
    units: dict[str, str] = {}
    rows = []
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if number(row.get("ID") or "") is None:
            if not rows and not units:
                units = {k: (v or "").strip() for k, v in row.items() if k}
            continue
        for k, unit in units.items():
            v = number(row.get(k) or "")
            if unit in SCALE and v is not None:
                row[k] = repr(v * SCALE[unit])
        rows.append(row)
    return rows


def first(row: dict[str, str], *names: str) -> float | None:
    """The value of the first of `names` (exact metric names, or a prefix ending in '*') the row
    has a number for."""
    for name in names:
        keys = [k for k in row if k == name or (name.endswith("*") and k.startswith(name[:-1]))]
        for k in keys:
            v = number(row[k] or "")
            if v is not None:
                return v
    return None


def summarize(row: dict[str, str]) -> dict[str, object]:
    stalls = {}
    for k, v in row.items():
        m = STALL.match(k or "")
        value = number(v or "")
        # "selected" and "not_selected" are warps that could issue, not stalls
        if m and value is not None and m.group(1) not in ("selected", "not_selected"):
            stalls[m.group(1)] = value
    read = first(row, "dram__bytes_read.sum")
    write = first(row, "dram__bytes_write.sum")
    duration = first(row, "gpu__time_duration.sum")
    return {
        "kernel": label(row.get("Kernel Name", "")),
        "us": duration / 1e3 if duration is not None else None,
        "dram_pct": first(
            row,
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        ),
        "dram_gbs": (read + write) / duration if None not in (read, write, duration) else None,
        "occupancy": first(row, "sm__warps_active.avg.pct_of_peak_sustained_active"),
        "theoretical": first(row, "sm__maximum_warps_per_active_cycle_pct"),
        "registers": first(row, "launch__registers_per_thread"),
        "grid": first(row, "launch__grid_size"),
        "stalls": sorted(stalls.items(), key=lambda kv: -kv[1]),
    }


def fmt(v: object, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def report(paths: list[str]) -> int:
    rows: list[dict[str, str]] = []
    for path in paths:
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                rows = read_raw(f.read())
        if rows:
            break
    if not rows:
        print(f"no profiled kernels in {', '.join(paths)} (did ncu run, may it read the counters?)")
        return 1
    print(
        "| kernel | us | DRAM % of peak | DRAM GB/s | occupancy % (achieved / theoretical) "
        "| registers | grid | top stalls (cycles per issued instruction) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        s = summarize(row)
        stalls = ", ".join(f"{k} {v:.1f}" for k, v in s["stalls"][:4]) or "-"
        print(
            f"| {s['kernel']} | {fmt(s['us'], '.1f')} | {fmt(s['dram_pct'], '.1f')} "
            f"| {fmt(s['dram_gbs'], '.0f')} "
            f"| {fmt(s['occupancy'], '.1f')} / {fmt(s['theoretical'], '.1f')} "
            f"| {fmt(s['registers'], '.0f')} | {fmt(s['grid'], '.0f')} | {stalls} |"
        )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="launch each codec kernel once (under ncu)")
    r.add_argument("--mib", type=int, default=64)
    p = sub.add_parser("report", help="a table of ncu's raw CSV")
    p.add_argument("csv", nargs="+")
    args = ap.parse_args()
    if args.cmd == "run":
        if args.mib < 1:
            ap.error("--mib must be at least 1")
        return run(args.mib)
    return report(args.csv)


if __name__ == "__main__":
    sys.exit(main())
