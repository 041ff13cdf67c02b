"""Throughput of the CPU codec on one core, beside a memory copy, and its share of a quantized
allreduce.

    .venv/bin/python benchmarks/codec_throughput.py                 # the tables and the profile
    .venv/bin/python benchmarks/codec_throughput.py --no-allreduce  # the codec tables (~30 s)
    .venv/bin/python benchmarks/codec_throughput.py --one-core      # per instruction set, vs copy
    .venv/bin/python benchmarks/codec_throughput.py --streamed      # a result's decode, streamed

1. Codec microbenchmark, one thread (``torch.set_num_threads(1)``), through
   ``qcomm.codec.encode`` and ``qcomm.codec.decode``: encode and decode
   at 8 and 4 bits, asymmetric (min/max, the default) and symmetric (absmax), fp32 and bf16
   input, messages of --sizes bytes of input (default 1 MiB and 64 MiB), group --group-size.
   Beside it, on the same machine and sizes: a memory copy into a preallocated tensor
   (``out.copy_(x)``, x in the input dtype).
   GB/s is message bytes (the input in its dtype) per second, for every column, copy included (a
   copy moves twice that: a read and a write). Each time is the median of repeated calls on the same
   data (cache-warm at 1 MiB, streaming from memory at 64 MiB).
   ``codec_encode`` allocates its output with ``at::zeros`` on every call and ``codec_decode`` its
   fp32 output with ``at::empty`` (first-touch page faults for large outputs); the allreduce writes
   into buffers instead, so these allocation costs are measured on their own
   (``torch.zeros(encoded bytes, uint8)``, and ``torch.empty(n, fp32).fill_(0)`` minus
   ``out.fill_(0)`` into a preallocated tensor) and subtracted: the "net" columns.
   With --isas (default: every instruction set the codec loops are compiled for that this CPU
   has, csrc/codec/codec_cpu_isa.h), the same calls again with each one's loops
   (qcomm.set_cpu_isa), in a table side by side; the first table is the default's
   (QCOMM_CPU_ISA, else the widest).
2. Where the time of a quantized allreduce goes (unless --no-allreduce): the main job
   (benchmarks/allreduce_bench.py) at --allreduce-size (default 64M) on 2 CPU ranks over loopback
   (its CSV rows), against the codec work each rank does in that allreduce (elements encoded and
   decoded per rank, from the algorithms' schedules for 2 ranks) timed at the net single-core rates
   of part 1 (fp32, the allreduce's bits, asymmetric, largest size). The rest is transport (Gloo
   over loopback TCP, whose kernel copies share the same 2 cores), waiting, buffer allocation and
   first touch.

Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time

import qbench

HERE = os.path.dirname(os.path.abspath(__file__))

# Elements encoded and decoded by each rank in one allreduce of N elements on 2 ranks (fractions of
# N), from csrc/algo/two_step.cpp, ring.cpp, semi_ring.cpp and gather.cpp:
#   two_step: encodes both chunks (rs, N), sums its chunk from 2 decoded copies (rs, N), encodes
#             the sum (ag, N/2), decodes its own and the peer's chunk (ag, N);
#   ring / semi_ring (the same schedule at W=2): encodes the peer's chunk (rs, N/2), decodes the
#             received partial onto its own (rs, N/2), encodes its sum (ag, N/2), decodes both
#             chunks of the all-gather (ag, N).
CODEC_WORK_W2 = {
    "two_step": {"enc_rs": 1.0, "dec_rs": 1.0, "enc_ag": 0.5, "dec_ag": 1.0},
    "ring": {"enc_rs": 0.5, "dec_rs": 0.5, "enc_ag": 0.5, "dec_ag": 1.0},
    "semi_ring": {"enc_rs": 0.5, "dec_rs": 0.5, "enc_ag": 0.5, "dec_ag": 1.0},
}


def timeit(fn, min_time: float, min_reps: int = 5, max_reps: int = 2000) -> float:
    """Median seconds of fn() over at least min_reps calls and min_time seconds (after one warm-up
    call)."""
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < max_reps and (
        len(times) < min_reps or time.perf_counter() - start < min_time
    ):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def microbench(opts) -> list:
    import torch

    from qcomm import codec, cpu_isa, set_cpu_isa

    rows = []
    gs = opts.group_size
    gen = torch.Generator().manual_seed(1234)
    for size in opts.sizes:
        base = torch.randn(size // 4, generator=gen)  # the same values for every dtype
        for dname in ("fp32", "bf16"):
            dtype = getattr(torch, qbench.DTYPES[dname])
            n = size // qbench.ELEM_BYTES[dname]
            x = base.to(dtype) if dname == "fp32" else torch.randn(n, generator=gen).to(dtype)
            out = torch.empty_like(x)
            copy_s = timeit(lambda out=out, x=x: out.copy_(x), opts.min_time)
            # the decode output's allocation: first touch of a fresh fp32 tensor vs a reused one
            pre = torch.empty(n, dtype=torch.float32)
            fresh_s = timeit(
                lambda n=n: torch.empty(n, dtype=torch.float32).fill_(0), opts.min_time
            )
            fill_s = timeit(lambda pre=pre: pre.fill_(0), opts.min_time)
            dec_alloc_s = max(0.0, fresh_s - fill_s)
            for bits in (8, 4):
                for sym in (False, True):
                    nbytes = codec.encoded_bytes(n, bits, gs, sym)
                    enc = codec.encode(x, bits, gs, sym)
                    assert enc.numel() == nbytes
                    enc_s = timeit(
                        lambda x=x, b=bits, s=sym, f=codec.encode: f(x, b, gs, s),
                        opts.min_time,
                    )
                    zeros_s = timeit(
                        lambda nb=nbytes: torch.zeros(nb, dtype=torch.uint8), opts.min_time
                    )
                    dec_s = timeit(
                        lambda e=enc, n=n, b=bits, s=sym, d=dtype: codec.decode(e, n, b, gs, s, d),
                        opts.min_time,
                    )
                    rows.append(
                        dict(
                            size=size,
                            dtype=dname,
                            n=n,
                            bits=bits,
                            symmetric=sym,
                            encoded_bytes=nbytes,
                            enc_s=enc_s,
                            enc_alloc_s=zeros_s,
                            enc_net_s=max(enc_s - zeros_s, 1e-12),
                            dec_s=dec_s,
                            dec_alloc_s=dec_alloc_s,
                            dec_net_s=max(dec_s - dec_alloc_s, 1e-12),
                            copy_s=copy_s,
                        )
                    )
                    r = rows[-1]
                    # the same calls with the loops of each other instruction set asked for
                    r["isa"] = {cpu_isa(): (r["enc_net_s"], r["dec_net_s"])}
                    for isa in opts.isas:
                        if isa in r["isa"]:
                            continue
                        before = set_cpu_isa(isa)
                        try:
                            e_s = timeit(
                                lambda x=x, b=bits, s=sym: codec.encode(x, b, gs, s),
                                opts.min_time,
                            )
                            d_s = timeit(
                                lambda e=enc, n=n, b=bits, s=sym, d=dtype: codec.decode(
                                    e, n, b, gs, s, d
                                ),
                                opts.min_time,
                            )
                        finally:
                            set_cpu_isa(before)
                        r["isa"][isa] = (max(e_s - zeros_s, 1e-12), max(d_s - dec_alloc_s, 1e-12))
                    print(
                        f"[codec] {qbench.size_label(size)} {dname} {bits}-bit "
                        f"{'sym' if sym else 'asym'}: encode {gbps(size, enc_s):.2f} GB/s "
                        f"(net {gbps(size, r['enc_net_s']):.2f}), decode {gbps(size, dec_s):.2f} "
                        f"GB/s (net {gbps(size, r['dec_net_s']):.2f}), copy "
                        f"{gbps(size, copy_s):.2f} GB/s",
                        file=sys.stderr,
                        flush=True,
                    )
            del x, out, pre
    return rows


# The cases of --one-core: (input dtype, bits, group size), asymmetric (the default codec).
ONE_CORE_CASES = [
    ("fp32", 8, 128),
    ("bf16", 8, 128),
    ("fp16", 8, 128),
    ("fp32", 4, 32),
    ("fp32", 4, 128),
    ("bf16", 4, 32),
]


def reuses_outputs() -> bool:
    """Whether this build's codec writes into given outputs (out=): then --one-core
    times the codec alone, else it subtracts the outputs' allocation, timed apart."""
    import torch

    from qcomm import codec

    x = torch.zeros(256)
    try:
        codec.encode(
            x,
            8,
            128,
            False,
            out=torch.empty(codec.encoded_bytes(256, 8, 128, False), dtype=torch.uint8),
        )
    except TypeError:
        return False
    return True


def one_core_bench(opts) -> list:
    """Encode, decode, one ring hop and a copy of the same input bytes, one thread, per instruction
    set, interleaved: each of --rounds rounds times every (size, case, isa) once (a median of
    calls over --min-time), so a change in the machine's load hits every column alike. Returns
    rows with the per-round GB/s of each column."""
    import torch

    from qcomm import codec, set_cpu_isa

    rows = {}
    gen = torch.Generator().manual_seed(77)
    data = {}
    for size in opts.sizes:
        base = torch.randn(size // 4, generator=gen) * 2 + 0.1
        for dname, bits, gs in ONE_CORE_CASES:
            dtype = getattr(torch, qbench.DTYPES[dname])
            n = size // qbench.ELEM_BYTES[dname]
            x = base.to(dtype) if dname == "fp32" else torch.randn(n, generator=gen).to(dtype)
            enc = codec.encode(x, bits, gs, False)
            # a second rank's copy of the same chunk, for two_step's sum of the copies
            other = codec.encode((x.float() * 0.75).to(dtype), bits, gs, False)
            data[(size, dname, bits, gs)] = (x, (enc, other), torch.empty_like(x))
    reuse = reuses_outputs() and not opts.allocating_outputs
    sums = reuse
    for r in range(opts.rounds):
        for (size, dname, bits, gs), (x, (enc, other), out) in data.items():
            n = x.numel()
            nbytes = enc.numel()
            copy_s = timeit(lambda out=out, x=x: out.copy_(x), opts.min_time)
            if reuse:
                # every call writes into the same buffers: the codec's time alone
                eo, do = torch.empty_like(enc), torch.empty(n, dtype=torch.float32)
                po, ho = torch.empty(n, dtype=torch.float32), torch.empty_like(enc)
                zeros_s = fp32_alloc_s = 0.0
            else:
                # each call allocates its outputs (a build without out=): their allocation and
                # first touch timed apart and subtracted
                eo = do = po = ho = None
                zeros_s = timeit(
                    lambda nb=nbytes: torch.zeros(nb, dtype=torch.uint8), opts.min_time
                )
                pre = torch.empty(n, dtype=torch.float32)
                fresh_s = timeit(
                    lambda n=n: torch.empty(n, dtype=torch.float32).fill_(0), opts.min_time
                )
                fp32_alloc_s = max(
                    0.0, fresh_s - timeit(lambda pre=pre: pre.fill_(0), opts.min_time)
                )
                del pre
            kw = {"out": eo} if reuse else {}
            dkw = {"out": do} if reuse else {}
            hkw = {"partial_out": po, "out": ho} if reuse else {}
            for isa in opts.isas:
                before = set_cpu_isa(isa)
                try:
                    enc_s = timeit(
                        lambda x=x, b=bits, g=gs, kw=kw: codec.encode(x, b, g, False, **kw),
                        opts.min_time,
                    )
                    dec_s = timeit(
                        lambda e=enc, n=n, b=bits, g=gs, kw=dkw: codec.decode(
                            e, n, b, g, False, **kw
                        ),
                        opts.min_time,
                    )
                    hop_s = timeit(
                        lambda e=enc, x=x, b=bits, g=gs, kw=hkw: codec.ring_hop(
                            e, x, b, b, g, False, **kw
                        ),
                        opts.min_time,
                    )
                    if sums:
                        # the sum of two copies: one pass (decodeSum) against a decode and a
                        # decode with accumulate
                        pair = [enc, other]
                        sum_s = timeit(
                            lambda n=n, b=bits, g=gs, p=pair, o=do: codec.decode_sum(
                                p, n, b, g, False, out=o
                            ),
                            opts.min_time,
                        )

                        def two(n=n, b=bits, g=gs, p=pair, o=do):
                            codec.decode(p[0], n, b, g, False, out=o)
                            codec.decode(p[1], n, b, g, False, out=o, accumulate=True)

                        two_s = timeit(two, opts.min_time)
                finally:
                    set_cpu_isa(before)
                row = rows.setdefault(
                    (size, dname, bits, gs, isa),
                    dict(
                        size=size,
                        dtype=dname,
                        bits=bits,
                        group=gs,
                        isa=isa,
                        enc=[],
                        dec=[],
                        hop=[],
                        copy=[],
                        sum=[],
                    ),
                )
                if sums:
                    row["sum"].append(two_s / sum_s)
                row["enc"].append(gbps(size, max(enc_s - zeros_s, 1e-12)))
                row["dec"].append(gbps(size, max(dec_s - fp32_alloc_s, 1e-12)))
                row["hop"].append(gbps(size, max(hop_s - fp32_alloc_s, 1e-12)))
                row["copy"].append(gbps(size, copy_s))
        print(f"[one-core] round {r + 1}/{opts.rounds} done", file=sys.stderr, flush=True)
    return list(rows.values())


STREAMED_SIZES_MIB = (1, 2, 4, 8, 16, 64)


def streamed_bench(opts) -> list:
    """--streamed: decode (8-bit g128, asymmetric) into a reused fp32 output with plain stores and
    with non-temporal ones (qcomm.codec.decode(streamed=True), CpuCodecOps::decodeResult's path),
    per instruction set and output size, each call timed alone. cold: a 128 MiB sum between calls
    evicts the output from the caches (an allreduce's result, last touched when its input was
    encoded); hot: the output was just written by the call before. Rounds interleave everything;
    returns rows of per-round time ratios plain / streamed."""
    import torch

    from qcomm import codec, set_cpu_isa

    evict = torch.randn(32 << 20, generator=torch.Generator().manual_seed(5))
    cases = []
    for mib in STREAMED_SIZES_MIB:
        n = (mib << 20) // 4
        x = torch.randn(n, generator=torch.Generator().manual_seed(mib))
        enc = codec.encode(x, 8, opts.group_size, False)
        cases.append((mib, n, enc, torch.empty(n)))
    rows = {}
    for r in range(opts.rounds):
        for isa in opts.isas:
            before = set_cpu_isa(isa)
            try:
                for mib, n, enc, out in cases:
                    for cold in (False, True):
                        times = {False: [], True: []}
                        for _ in range(9):
                            for streamed in (False, True):
                                if cold:
                                    evict.sum()
                                t0 = time.perf_counter()
                                codec.decode(
                                    enc, n, 8, opts.group_size, False, out=out, streamed=streamed
                                )
                                times[streamed].append(time.perf_counter() - t0)
                        row = rows.setdefault(
                            (isa, mib, cold), dict(isa=isa, mib=mib, cold=cold, ratio=[], ms=[])
                        )
                        plain, streamed_s = (statistics.median(times[k]) for k in (False, True))
                        row["ratio"].append(plain / streamed_s)
                        row["ms"].append((plain * 1e3, streamed_s * 1e3))
            finally:
                set_cpu_isa(before)
        print(f"[streamed] round {r + 1}/{opts.rounds} done", file=sys.stderr, flush=True)
    return list(rows.values())


def streamed_table(rows: list) -> str:
    head = ["isa", "output", "cache", "plain ms", "streamed ms", "plain / streamed (range)"]
    lines = []
    for row in rows:
        plain = statistics.median(m[0] for m in row["ms"])
        streamed = statistics.median(m[1] for m in row["ms"])
        med, lo, hi = qbench.spread(row["ratio"])
        lines.append(
            [
                row["isa"],
                f"{row['mib']} MiB",
                "cold" if row["cold"] else "hot",
                f"{plain:.3f}",
                f"{streamed:.3f}",
                f"{med:.2f} ({lo:.2f}-{hi:.2f})",
            ]
        )
    return qbench.md_table(head, lines)


def one_core_table(rows: list) -> str:
    """Median GB/s (min-max over rounds) per column, and encode over copy."""

    def cell(v):
        return "{:.2f} ({:.2f}-{:.2f})".format(*qbench.spread(v))

    head = ["size", "input", "bits", "group", "isa", "encode GB/s", "decode GB/s", "hop GB/s"]
    head += ["copy GB/s", "encode/copy", "sum of 2 copies: 2 decodes / 1 pass"]
    lines = []
    for r in rows:
        ratio = statistics.median(r["enc"]) / statistics.median(r["copy"])
        sum_cell = "{:.2f}x ({:.2f}-{:.2f})".format(*qbench.spread(r["sum"])) if r["sum"] else "-"
        lines.append(
            [qbench.size_label(r["size"]), r["dtype"], r["bits"], r["group"], r["isa"]]
            + [cell(r["enc"]), cell(r["dec"]), cell(r["hop"]), cell(r["copy"])]
            + [f"{ratio:.2f}", sum_cell]
        )
    return qbench.md_table(head, lines)


def rotation_bench(opts) -> list:
    """The rotated codec (rotate=True: each group Hadamard-rotated inside the encode and decode
    loops) against the plain one, the same calls interleaved: --rounds rounds, each timing plain
    then rotated encode, then plain then rotated decode, for --min-time / 2 each. Net of the
    output allocation (as the codec table), one thread. Returns one row per (size, dtype, bits,
    scale) with the per-round ratios rotated / plain of GB/s."""
    import torch

    from qcomm import codec

    rows = []
    gs = opts.group_size
    gen = torch.Generator().manual_seed(4321)
    for size in opts.sizes:
        for dname in ("fp32", "bf16"):
            dtype = getattr(torch, qbench.DTYPES[dname])
            n = size // qbench.ELEM_BYTES[dname] // gs * gs
            x = torch.randn(n, generator=gen).to(dtype)
            pre = torch.empty(n, dtype=torch.float32)
            dec_alloc_s = max(
                0.0,
                timeit(lambda n=n: torch.empty(n, dtype=torch.float32).fill_(0), opts.min_time)
                - timeit(lambda pre=pre: pre.fill_(0), opts.min_time),
            )
            for bits in (8, 4):
                for sym in (False, True):
                    nbytes = codec.encoded_bytes(n, bits, gs, sym)
                    zeros_s = timeit(
                        lambda nb=nbytes: torch.zeros(nb, dtype=torch.uint8), opts.min_time
                    )
                    enc = {r: codec.encode(x, bits, gs, sym, rotate=r) for r in (False, True)}
                    ratios = {"encode": [], "decode": []}
                    rates = {(k, r): [] for k in ratios for r in (False, True)}
                    for _ in range(opts.rounds):
                        for kind in ("encode", "decode"):
                            got = {}
                            for r in (False, True):
                                if kind == "encode":
                                    s = timeit(
                                        lambda r=r, b=bits, q=sym, x=x: codec.encode(
                                            x, b, gs, q, rotate=r
                                        ),
                                        opts.min_time / 2,
                                    )
                                    net = max(s - zeros_s, 1e-12)
                                else:
                                    s = timeit(
                                        lambda r=r, b=bits, q=sym, e=enc, n=n, d=dtype: (
                                            codec.decode(e[r], n, b, gs, q, d, rotate=r)
                                        ),
                                        opts.min_time / 2,
                                    )
                                    net = max(s - dec_alloc_s, 1e-12)
                                got[r] = gbps(n * x.element_size(), net)
                                rates[(kind, r)].append(got[r])
                            ratios[kind].append(got[True] / got[False])
                    row = dict(size=size, dtype=dname, bits=bits, symmetric=sym)
                    for kind in ratios:
                        row[kind] = (
                            statistics.median(rates[(kind, False)]),
                            statistics.median(rates[(kind, True)]),
                            statistics.median(ratios[kind]),
                            min(ratios[kind]),
                            max(ratios[kind]),
                        )
                    rows.append(row)
                    e, d = row["encode"], row["decode"]
                    print(
                        f"[rotation] {qbench.size_label(size)} {dname} {bits}-bit "
                        f"{'sym' if sym else 'asym'}: encode {e[0]:.2f} -> {e[1]:.2f} GB/s "
                        f"({e[2]:.2f}x), decode {d[0]:.2f} -> {d[1]:.2f} GB/s ({d[2]:.2f}x)",
                        file=sys.stderr,
                        flush=True,
                    )
    return rows


def rotation_table(rows: list) -> str:
    head = ["size", "input", "bits", "scale"]
    for kind in ("encode", "decode"):
        head += [f"{kind} net GB/s", f"{kind} rotated", f"{kind} ratio (min-max)"]
    lines = []
    for r in rows:
        cells = row_label(r)
        for kind in ("encode", "decode"):
            plain, rot, med, lo, hi = r[kind]
            cells += [f"{plain:.2f}", f"{rot:.2f}", f"{med:.2f}x ({lo:.2f}-{hi:.2f})"]
        lines.append(cells)
    return qbench.md_table(head, lines)


def row_label(r: dict) -> list:
    """The first cells of a codec row: size, input dtype, bits, scale."""
    return [
        qbench.size_label(r["size"]),
        r["dtype"],
        str(r["bits"]),
        "sym" if r["symmetric"] else "asym",
    ]


def codec_table(rows: list) -> str:
    head = [
        "size",
        "input",
        "bits",
        "scale",
        "encode GB/s",
        "zeros alloc ms",
        "encode net GB/s",
        "decode GB/s",
        "out alloc ms",
        "decode net GB/s",
        "copy GB/s",
        "encode net / copy",
        "decode net / copy",
    ]
    lines = []
    for r in rows:
        s = r["size"]
        cells = [
            *row_label(r),
            f"{gbps(s, r['enc_s']):.2f}",
            f"{r['enc_alloc_s'] * 1e3:.3f}",
            f"{gbps(s, r['enc_net_s']):.2f}",
            f"{gbps(s, r['dec_s']):.2f}",
            f"{r['dec_alloc_s'] * 1e3:.3f}",
            f"{gbps(s, r['dec_net_s']):.2f}",
            f"{gbps(s, r['copy_s']):.2f}",
            f"{r['copy_s'] / r['enc_net_s']:.3f}",
            f"{r['copy_s'] / r['dec_net_s']:.3f}",
        ]
        lines.append(cells)
    return qbench.md_table(head, lines)


def isa_table(rows: list, isas: list) -> str:
    """Net encode and decode GB/s per instruction set of the CPU codec's loops, side by side, and
    the widest one's speed-up over the baseline ("generic")."""
    head = ["size", "input", "bits", "scale"]
    head += [f"encode net GB/s {i}" for i in isas] + [f"decode net GB/s {i}" for i in isas]
    wide = isas[-1]
    if "generic" in isas and wide != "generic":
        head += [f"encode {wide} / generic", f"decode {wide} / generic"]
    lines = []
    for r in rows:
        s = r["size"]
        t = r["isa"]
        cells = row_label(r)
        cells += [f"{gbps(s, t[i][0]):.2f}" for i in isas]
        cells += [f"{gbps(s, t[i][1]):.2f}" for i in isas]
        if "generic" in isas and wide != "generic":
            cells += [
                f"{t['generic'][0] / t[wide][0]:.2f}x",
                f"{t['generic'][1] / t[wide][1]:.2f}x",
            ]
        lines.append(cells)
    return qbench.md_table(head, lines)


def run_bench(opts) -> list:
    """The main job's rows (as read back from its CSV) for the allreduce profile."""
    with tempfile.TemporaryDirectory(prefix="qcomm-codec-") as tmp:
        path = os.path.join(tmp, "rows.csv")
        cmd = [
            sys.executable,
            os.path.join(HERE, "allreduce_bench.py"),
            "--world",
            "2",
            "--sizes",
            qbench.size_label(opts.allreduce_size),
            "--bits",
            opts.allreduce_bits,
            "--group-size",
            str(opts.group_size),
            "--iters",
            str(opts.allreduce_iters),
            "--csv",
            path,
        ]
        print("[allreduce] " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
        root = qbench.ROOT
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        subprocess.run(cmd, check=True, cwd=root, env=env, stdout=subprocess.DEVNULL)
        with open(path, newline="") as f:
            return list(csv.DictReader(f))


def profile_table(bench_rows: list, codec_rows: list) -> str:
    """Codec time per rank vs the measured allreduce time (fp32, 2 ranks)."""
    size_ref = max(r["size"] for r in codec_rows)
    rate = {}  # (bits, 'enc'/'dec') -> net seconds per element, fp32, asymmetric, largest size
    for r in codec_rows:
        if r["size"] == size_ref and r["dtype"] == "fp32" and not r["symmetric"]:
            rate[(r["bits"], "enc")] = r["enc_net_s"] / r["n"]
            rate[(r["bits"], "dec")] = r["dec_net_s"] / r["n"]
    head = [
        "algorithm",
        "bits",
        "allreduce ms",
        "gloo fp32 ms",
        "encode ms",
        "decode ms",
        "codec ms",
        "codec share",
        "rest ms",
    ]
    lines = []
    for br in bench_rows:
        algo = br["algorithm"]
        rs, ag = (int(b) for b in br["bits"].split("/"))
        n = int(br["count"])
        w = CODEC_WORK_W2[algo]
        enc = (w["enc_rs"] * rate[(rs, "enc")] + w["enc_ag"] * rate[(ag, "enc")]) * n
        dec = (w["dec_rs"] * rate[(rs, "dec")] + w["dec_ag"] * rate[(ag, "dec")]) * n
        t = float(br["time_us"]) * 1e-6
        cells = [
            algo,
            br["bits"],
            f"{t * 1e3:.1f}",
            f"{float(br['exact_us']) * 1e-3:.1f}",
            f"{enc * 1e3:.1f}",
            f"{dec * 1e3:.1f}",
            f"{(enc + dec) * 1e3:.1f}",
            f"{(enc + dec) / t:.0%}",
            f"{(t - enc - dec) * 1e3:.1f}",
        ]
        lines.append(cells)
    return qbench.md_table(head, lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--sizes",
        type=qbench.parse_sizes,
        default=qbench.parse_sizes("1M,64M"),
        help="message sizes in input bytes (default 1M,64M)",
    )
    ap.add_argument("--group-size", type=int, default=128, help="elements per scale (default 128)")
    ap.add_argument(
        "--min-time", type=float, default=0.25, help="seconds of timing per measurement (0.25)"
    )
    ap.add_argument("--no-allreduce", action="store_true", help="skip the allreduce profile")
    ap.add_argument(
        "--allreduce-size",
        type=qbench.parse_size,
        default=qbench.parse_size("64M"),
        help="message size of the allreduce profile (default 64M)",
    )
    ap.add_argument(
        "--allreduce-bits", default="8/8,4/4", help="rs/ag pairs profiled (default 8/8,4/4)"
    )
    ap.add_argument(
        "--allreduce-iters", type=int, default=5, help="timed allreduces per config (default 5)"
    )
    ap.add_argument(
        "--isas",
        default="all",
        help="instruction sets of the codec loops timed side by side (comma-separated, or 'all' "
        "for every one this CPU has, the default; 'none' for only the one in use)",
    )
    ap.add_argument(
        "--rotation",
        action="store_true",
        help="only the rotated codec against the plain one, interleaved (rotate=True's cost)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="interleaved rounds of --rotation and --one-core (default 5)",
    )
    ap.add_argument(
        "--allocating-outputs",
        action="store_true",
        help="--one-core: let each call allocate its outputs and subtract their allocation, timed "
        "apart, as for a build whose test hooks take no out= (to compare with one)",
    )
    ap.add_argument(
        "--streamed",
        action="store_true",
        help="only the decode of a result with plain against non-temporal stores, per instruction "
        "set, outputs of 1 to 64 MiB, cold and hot, interleaved over --rounds",
    )
    ap.add_argument(
        "--one-core",
        action="store_true",
        help="only encode, decode, a ring hop and a copy of the same bytes, per instruction set, "
        "interleaved over --rounds (fp32/bf16/fp16 8-bit g128, 4-bit g32 and g128, asymmetric)",
    )
    opts = ap.parse_args(argv)

    import torch

    import qcomm

    have = qcomm.cpu_isas()
    if opts.isas == "all":
        opts.isas = have
    elif opts.isas == "none":
        opts.isas = []
    else:
        opts.isas = [i.strip() for i in opts.isas.split(",") if i.strip()]
        missing = [i for i in opts.isas if i not in have]
        if missing:
            ap.error(
                f"--isas: {', '.join(missing)} not available here (this CPU: {', '.join(have)})"
            )

    torch.set_num_threads(1)
    start = time.perf_counter()
    print(
        f"# codec_throughput: {qbench.cpu_model()}, {os.cpu_count()} logical cores, "
        f"torch {torch.__version__}, 1 thread (torch.get_num_threads() = "
        f"{torch.get_num_threads()}), group size {opts.group_size}, qcomm CUDA kernels compiled: "
        f"{qcomm.compiled_with_cuda()}, codec loops {qcomm.cpu_isa()} (this CPU: "
        f"{', '.join(have)}), load average at start " + qbench.load_average(),
        flush=True,
    )
    if opts.streamed:
        if not opts.isas:
            opts.isas = [qcomm.cpu_isa()]
        rows = streamed_bench(opts)
        print(
            f"\n## A result's decode, plain and streamed stores ({opts.rounds} interleaved rounds; "
            "8-bit g128 asymmetric, one thread; medians of 9 calls per round)\n"
        )
        print(streamed_table(rows), flush=True)
        print(f"\n# {time.perf_counter() - start:.0f} s", flush=True)
        return 0
    if opts.one_core:
        if not opts.isas:
            opts.isas = [qcomm.cpu_isa()]
        reuse = reuses_outputs() and not opts.allocating_outputs
        print(
            "# outputs: "
            + (
                "reused buffers (out=), nothing allocated in the timed calls"
                if reuse
                else "allocated by each call; their allocation timed apart and subtracted"
            ),
            flush=True,
        )
        rows = one_core_bench(opts)
        print(
            f"\n## The CPU codec on one core, per instruction set ({opts.rounds} interleaved "
            "rounds; median GB/s of input bytes and its range over rounds, asymmetric)\n"
        )
        print(one_core_table(rows), flush=True)
        if reuse:
            print(
                "\nencode: qcomm.codec.encode into a reused buffer; decode: qcomm.codec.decode "
                "into a reused fp32 tensor; hop: qcomm.codec.ring_hop (decode + add the local "
                "input + encode, bits in = out) into reused partial sums and bytes; copy: "
                "out.copy_(x) of the same input bytes into a reused tensor, one thread; sum of 2 "
                "copies: the time of a decode and a decode with accumulate over that of "
                "qcomm.codec.decode_sum (one pass), the same two "
                "blocks and output (two_step's sum at 2 ranks)."
            )
        else:
            print(
                "\nencode: qcomm.codec.encode minus its output allocation (torch.zeros of the "
                "encoded size, timed in the same round); decode: qcomm.codec.decode, minus a fresh "
                "fp32 output's first touch (torch.empty(n).fill_(0) minus fill_ into a reused "
                "tensor, same round); hop: qcomm.codec.ring_hop (decode + add the local input + "
                "encode, bits in = out), minus the same first touch of its fp32 partial sums; "
                "copy: out.copy_(x) of the same input bytes into a reused tensor, one thread."
            )
        print(f"\n# {time.perf_counter() - start:.0f} s", flush=True)
        return 0
    if opts.rotation:
        rows = rotation_bench(opts)
        print(
            f"\n## The rotated codec against the plain one, one core, group {opts.group_size} "
            f"({opts.rounds} interleaved rounds; ratio = rotated / plain GB/s, median and "
            "range over rounds)\n"
        )
        print(rotation_table(rows), flush=True)
        print(f"\n# {time.perf_counter() - start:.0f} s", flush=True)
        return 0
    rows = microbench(opts)
    print(
        "\n## CPU codec, one core (GB/s = input bytes per second; 'net' = minus the output "
        "allocation measured alone)\n"
    )
    print(codec_table(rows), flush=True)
    print(
        "\n'zeros alloc ms': torch.zeros of the encoded size, which codec_encode does on every "
        "call (encodeBlock writes every byte of its output, so at::empty would do); "
        "'out alloc ms': a fresh fp32 output's first touch (torch.empty(n).fill_(0) minus fill_ "
        "into a reused tensor), paid by codec_decode's at::empty. copy: out.copy_(x) into a "
        "preallocated tensor of the input dtype."
    )
    if len(opts.isas) > 1:
        isas = [i for i in have if i in opts.isas]  # narrowest first
        print(
            "\n## The codec loops per instruction set (the same calls, net GB/s as above; "
            "QCOMM_CPU_ISA / qcomm.set_cpu_isa)\n"
        )
        print(isa_table(rows, isas), flush=True)
    if not opts.no_allreduce:
        bench_rows = run_bench(opts)
        size_ref = qbench.size_label(max(opts.sizes))
        print(
            "\n## Where a quantized allreduce's time goes: "
            f"{qbench.size_label(opts.allreduce_size)} fp32, 2 ranks, loopback "
            f"(benchmarks/allreduce_bench.py, median of "
            f"{opts.allreduce_iters}, max over ranks)\n"
        )
        print(profile_table(bench_rows, rows))
        print(
            f"\ncodec ms: the elements each rank encodes and decodes in this allreduce x the net "
            f"single-core time per element (fp32, asymmetric, {size_ref} rows above); decode into "
            "an accumulating sum is timed as a plain decode. Each rank has one core of the two; "
            "'rest' is transport (loopback TCP: kernel copies on the same cores), waiting for the "
            "peer, buffer allocation and first touch, Python."
        )
    load = qbench.load_average()
    print(f"\n# {time.perf_counter() - start:.1f} s; load average at the end {load}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
