"""Predicted allreduce time of qnccl's three algorithms and of NCCL's ring on W GPUs, computed from
kernel costs measured on ONE GPU (benchmarks/data/h200_codec_kernels.csv) and an assumed link
bandwidth. These are predictions, not measurements of W GPUs. Derivation and assumptions:
benchmarks/COST_MODEL.md.

    python benchmarks/cost_model.py [--world 8] [--links nvlink=370,pcie=25[:alpha_us]]
        [--sizes-mib 1,16,64,256,1024] [--bits 8/8,4/8,4/4] [--symmetric]
        [--kernel-csv FILE[,FILE...]] [--markdown out.md]

Sizes are bf16 messages (MiB); the NCCL fp32 column is the same element count in fp32. The
quantized wire format does not depend on the input dtype, so one qnccl time serves both baselines.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import os
import sys
import textwrap
from typing import Dict, List, Optional, Sequence, Tuple

import qbench  # (this checkout's qcomm first on sys.path) the tables

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CSV = os.path.join(HERE, "data", "h200_codec_kernels.csv")
MIB = 1 << 20
ALGORITHMS = ("two_step", "ring", "semi_ring")


# ---- wire format (csrc/codec/codec.h) ----


def _encoded_bytes_py(n: int, bits: int, group: int, symmetric: bool) -> int:
    """csrc/codec/codec.h encodedBytes: 16-byte aligned metadata (fp32 scale, plus fp32 mid when
    asymmetric, per group), then ceil(n * bits / 8) data bytes."""
    if n <= 0:
        return 0
    groups = (n + group - 1) // group
    meta = groups * 4 * (1 if symmetric else 2)
    return (meta + 15) // 16 * 16 + (n * bits + 7) // 8


try:  # the exact count from the extension when it is built; the formula above otherwise
    from qcomm import codec as _codec

    def encoded_bytes(n: int, bits: int, group: int, symmetric: bool) -> int:
        return int(_codec.encoded_bytes(n, bits, group, symmetric)) if n > 0 else 0

    ENCODED_BYTES_SOURCE = "qcomm.codec.encoded_bytes"
except Exception:  # noqa: BLE001 - any import failure: fall back to the documented formula
    encoded_bytes = _encoded_bytes_py
    ENCODED_BYTES_SOURCE = "formula of csrc/codec/codec.h (qcomm._C not importable)"


# ---- chunk geometry (csrc/plan/plan.cpp) ----


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def chunk_shards(n: int, world: int, group: int, microshards: int) -> List[List[int]]:
    """Element counts of the shards of each chunk: chunk c has chunkElems = ceil(groups / W)
    groups (the last chunks may be short or empty), cut into shards of ceil(chunk groups / M)
    groups; every shard is encoded separately."""
    ce = _cdiv(_cdiv(n, group), world) * group
    se = _cdiv(_cdiv(ce, group), microshards) * group
    out = []
    for c in range(world):
        begin = min(c * ce, n)
        length = min(ce, n - begin)
        out.append([min(se, length - k * se) for k in range(microshards) if k * se < length])
    return out


def wire_bytes_per_rank(
    n: int,
    world: int,
    rs_bits: int,
    ag_bits: int,
    group: int = 128,
    symmetric: bool = False,
    microshards: int = 4,
) -> List[Tuple[int, int]]:
    """(reduce-phase bytes, gather-phase bytes) each rank sends, the same for all three
    algorithms: in the reduce phase rank r sends one encoded copy of every chunk but its own
    (two_step: straight to each owner; ring: chunk r-s-1 at step s, s = 0..W-2; semi_ring: chunks
    r-R..r-1 one way and r+1..r+L the other, R + L = W - 1); in the gather phase it sends its own
    chunk, encoded with the gather codec, to each of the W - 1 peers (csrc/algo/gather.cpp)."""
    shards = chunk_shards(n, world, group, microshards)
    rs = [sum(encoded_bytes(s, rs_bits, group, symmetric) for s in ch) for ch in shards]
    ag = [sum(encoded_bytes(s, ag_bits, group, symmetric) for s in ch) for ch in shards]
    total_rs = sum(rs)
    return [(total_rs - rs[r], (world - 1) * ag[r]) for r in range(world)]


# ---- measured kernel costs ----


@dataclasses.dataclass(frozen=True)
class Link:
    name: str
    gbps: float  # effective bytes per second per GPU (egress), in 1e9
    alpha_us: float = 3.0  # latency per synchronized step


def parse_links(spec: str, alpha_us: float) -> List[Link]:
    links = []
    for item in spec.split(","):
        name, _, rest = item.partition("=")
        bw, _, alpha = rest.partition(":")
        links.append(Link(name.strip(), float(bw), float(alpha) if alpha else alpha_us))
    return links


class KernelCosts:
    """Per-call kernel times from a CSV with columns MiB, kernel, bits, scale, time_us (MiB = fp32
    input bytes of the call, as benchmarks/cuda_codec_bench.py measures). A call of b input bytes
    costs b times the per-byte time of the row closest in log size; below the smallest measured
    size, the smallest row's per-byte time plus launch_us (the measured rows already contain
    their launch). The per-byte time at a size between two rows is interpolated linearly in
    log(size) (rate="interp") or taken from the closest row (rate="closest"). `codec_scale`
    multiplies every codec time (0 = an infinitely fast codec)."""

    def __init__(
        self,
        rows: Sequence[Dict[str, str]],
        launch_us: float = 4.0,
        codec_scale: float = 1.0,
        source: str = "",
        rate: str = "interp",
    ):
        if rate not in ("interp", "closest"):
            raise ValueError(f"rate must be 'interp' or 'closest', not {rate!r}")
        self.rate = rate
        self.launch_us = launch_us
        self.codec_scale = codec_scale
        self.source = source
        self.table: Dict[Tuple[str, str, str], List[Tuple[int, float]]] = {}
        for r in rows:
            key = (r["kernel"].strip(), r["bits"].strip(), r["scale"].strip())
            nbytes = int(round(float(r["MiB"]) * MIB))
            self.table.setdefault(key, []).append((nbytes, float(r["time_us"])))
        for v in self.table.values():
            v.sort()
        if ("copy", "-", "-") not in self.table:
            raise ValueError(f"{source}: no 'copy' rows (the HBM bandwidth reference)")

    @classmethod
    def from_csv(cls, path: str, **kw) -> "KernelCosts":
        """One CSV, or several separated by commas, read as one (e.g. the codec kernels' CSV and
        a `separate_two_step` one); `source` names them joined by " + "."""
        rows = []
        for p in path.split(","):
            with open(p, newline="") as f:
                rows += list(csv.DictReader(f))
        return cls(rows, source=path.replace(",", " + "), **kw)

    def _rate(self, points: List[Tuple[int, float]], nbytes: int) -> float:
        """Microseconds per input byte at a call size of nbytes."""
        if self.rate == "closest":
            # the closest row in log size; a tie goes to the smaller (slower per byte) row
            b, t = min(points, key=lambda p: (round(abs(math.log(p[0] / nbytes)), 9), p[0]))
            return t / b
        # linear in log(size) between the neighbouring rows, flat beyond the ends
        if nbytes <= points[0][0]:
            return points[0][1] / points[0][0]
        for (b0, t0), (b1, t1) in zip(points, points[1:]):
            if nbytes <= b1:
                w = math.log(nbytes / b0) / math.log(b1 / b0)
                return t0 / b0 + w * (t1 / b1 - t0 / b0)
        return points[-1][1] / points[-1][0]

    def _call_us(self, points: List[Tuple[int, float]], nbytes: int) -> float:
        if nbytes <= 0:
            return 0.0
        t = self._rate(points, nbytes) * nbytes
        return t + self.launch_us if nbytes < points[0][0] else t

    def kernel_us(self, kind: str, bits: int, symmetric: bool, elems: int) -> float:
        """One encode/decode call over `elems` elements (costed as fp32 input, as measured)."""
        key = (kind, str(bits), "sym" if symmetric else "asym")
        if key not in self.table:
            raise KeyError(f"{self.source}: no rows for kernel={kind} bits={bits} scale={key[2]}")
        return self.codec_scale * self._call_us(self.table[key], 4 * elems)

    def fused_key(self, rs_bits: int, ag_bits: int, symmetric: bool):
        """The CSV's row key of a whole two_step measured on one GPU: the fused CUDA-IPC kernel
        ('fused_two_step') or, when the CSV has no such row, the separate kernels over CUDA IPC
        ('separate_two_step'); None when it has neither."""
        scale = "sym" if symmetric else "asym"
        for kernel in ("fused_two_step", "separate_two_step"):
            for bits in (f"{rs_bits}/{ag_bits}",) + ((str(rs_bits),) if rs_bits == ag_bits else ()):
                if (kernel, bits, scale) in self.table:
                    return (kernel, bits, scale)
        return None

    def fused_two_step_us(self, rs_bits: int, ag_bits: int, symmetric: bool, elems: int):
        """Codec (non-link) time of the fused two_step on one GPU, if the CSV has such rows."""
        key = self.fused_key(rs_bits, ag_bits, symmetric)
        if key is None:
            return None
        return self.codec_scale * self._call_us(self.table[key], 4 * elems)

    def hbm_gbps(self, nbytes: int) -> float:
        """Device-to-device copy bandwidth (bytes read plus written) at the closest size."""
        return 2 / (self._rate(self.table[("copy", "-", "-")], nbytes) * 1e-6) / 1e9


# ---- the model ----


@dataclasses.dataclass
class Phase:
    name: str
    link_bytes: int  # bytes the busiest rank sends in this phase
    codec_us: float  # encode + decode kernel time of one rank in this phase
    steps: int  # synchronized steps (each costs alpha)


@dataclasses.dataclass
class Prediction:
    serial_us: float
    overlap_us: float
    link_us: float
    codec_us: float
    latency_us: float
    wire_bytes: int

    @property
    def bound(self) -> str:
        return "link" if self.link_us >= self.codec_us else "codec"


def _combine(phases: Sequence[Phase], link: Link, microshards: int) -> Prediction:
    ser = ovl = lk_all = cd_all = lat = 0.0
    for p in phases:
        lk = p.link_bytes / (link.gbps * 1e9) * 1e6 if math.isfinite(link.gbps) else 0.0
        a = p.steps * link.alpha_us
        ser += lk + p.codec_us + a
        # pipelined over microshards: the slower resource, plus one shard of the faster one to
        # fill and drain the pipeline
        ovl += max(lk, p.codec_us) + min(lk, p.codec_us) / microshards + a
        lk_all += lk
        cd_all += p.codec_us
        lat += a
    wire = sum(p.link_bytes for p in phases)
    return Prediction(ser, ovl, lk_all, cd_all, lat, wire)


def phases(
    algorithm: str,
    n: int,
    world: int,
    costs: KernelCosts,
    rs_bits: int = 8,
    ag_bits: int = 8,
    group: int = 128,
    symmetric: bool = False,
    microshards: int = 4,
) -> List[Phase]:
    W = world
    wires = wire_bytes_per_rank(n, W, rs_bits, ag_bits, group, symmetric, microshards)
    rs_link = max(w[0] for w in wires)
    ag_link = max(w[1] for w in wires)
    ce = _cdiv(_cdiv(n, group), W) * group  # the largest chunk

    def k(kind, bits, elems):
        return costs.kernel_us(kind, bits, symmetric, elems)

    # gather phase, shared: encode the own chunk, decode all W chunks (own one included)
    gather = Phase("gather", ag_link, k("encode", ag_bits, ce) + k("decode", ag_bits, W * ce), 1)
    if algorithm == "two_step":
        fused = costs.fused_two_step_us(rs_bits, ag_bits, symmetric, n)
        if fused is not None:
            return [Phase("fused", rs_link + ag_link, fused, 2)]
        # encode the whole message once; the owner decodes W copies of its chunk and sums them
        reduce = Phase("reduce", rs_link, k("encode", rs_bits, n) + k("decode", rs_bits, W * ce), 1)
    elif algorithm == "ring":
        # W-1 hops, each: decode the partial, add, encode, send one chunk
        hop = k("encode", rs_bits, ce) + k("decode", rs_bits, ce)
        reduce = Phase("reduce", rs_link, (W - 1) * hop, W - 1)
    elif algorithm == "semi_ring":
        # R steps; the last L of them run both directions. The same W-1 chunk encodes and sends
        # per rank as the ring, through the same egress (NVSwitch / PCIe switch), in R steps.
        R, L = W // 2, (W - 1) // 2
        hop = k("encode", rs_bits, ce) + k("decode", rs_bits, ce)
        reduce = Phase("reduce", rs_link, (R + L) * hop, R)
    else:
        raise ValueError(f"unknown algorithm {algorithm!r}")
    return [reduce, gather]


def predict(
    algorithm: str,
    n: int,
    world: int,
    link: Link,
    costs: KernelCosts,
    rs_bits: int = 8,
    ag_bits: int = 8,
    group: int = 128,
    symmetric: bool = False,
    microshards: int = 4,
) -> Prediction:
    """Predicted time of one qnccl allreduce of n elements (any input dtype) on `world` GPUs."""
    ph = phases(algorithm, n, world, costs, rs_bits, ag_bits, group, symmetric, microshards)
    return _combine(ph, link, microshards)


def nccl_ring(
    n: int, elem_bytes: int, world: int, link: Link, costs: Optional[KernelCosts]
) -> Prediction:
    """NCCL's ring allreduce: 2(W-1) steps of one chunk (ceil(n/W) elements) each. Per step the
    GPU's HBM sees 3 chunk-sized accesses (the peer's incoming write, the read of it, the read of
    the local input or the write of the output). NCCL's kernel overlaps the two: time =
    max(link, HBM) + 2(W-1) alpha (overlap_us); serial_us adds them."""
    W = world
    chunk = _cdiv(n, W) * elem_bytes
    wire = 2 * (W - 1) * chunk
    lk = wire / (link.gbps * 1e9) * 1e6 if math.isfinite(link.gbps) else 0.0
    if costs is None:
        mem = 0.0
    else:
        mem = 2 * (W - 1) * 3 * chunk / (costs.hbm_gbps(n * elem_bytes) * 1e9) * 1e6
    lat = 2 * (W - 1) * link.alpha_us
    return Prediction(lk + mem + lat, max(lk, mem) + lat, lk, mem, lat, wire)


# ---- CLI ----

COLUMNS = [
    "link",
    "MiB bf16",
    "algorithm",
    "bits rs/ag",
    "wire MiB/rank",
    "qnccl serial us",
    "qnccl overlap us",
    "NCCL bf16 us",
    "NCCL fp32 us",
    "x bf16 serial",
    "x bf16 overlap",
    "x fp32 serial",
    "x fp32 overlap",
    "bound",
]


def table(
    world: int,
    links: Sequence[Link],
    sizes_mib: Sequence[float],
    bits: Sequence[Tuple[int, int]],
    costs: KernelCosts,
    algorithms: Sequence[str] = ALGORITHMS,
    group: int = 128,
    symmetric: bool = False,
    microshards: int = 4,
) -> List[List[str]]:
    rows = []
    for link in links:
        for mib in sizes_mib:
            n = int(mib * MIB) // 2  # elements of a bf16 message of `mib` MiB
            bf = nccl_ring(n, 2, world, link, costs).overlap_us
            fp = nccl_ring(n, 4, world, link, costs).overlap_us
            for algo in algorithms:
                for rb, ab in bits:
                    p = predict(algo, n, world, link, costs, rb, ab, group, symmetric, microshards)
                    rows.append(
                        [
                            link.name,
                            f"{mib:g}",
                            algo,
                            f"{rb}/{ab}",
                            f"{p.wire_bytes / MIB:.2f}",
                            f"{p.serial_us:.1f}",
                            f"{p.overlap_us:.1f}",
                            f"{bf:.1f}",
                            f"{fp:.1f}",
                            f"{bf / p.serial_us:.2f}",
                            f"{bf / p.overlap_us:.2f}",
                            f"{fp / p.serial_us:.2f}",
                            f"{fp / p.overlap_us:.2f}",
                            p.bound,
                        ]
                    )
    return rows


# The markdown output keeps its lines within 100 characters: two tables of the same rows, the
# times and then the speed-ups, both led by the four columns that name the row, under shorter
# headers that MD_LEGEND explains
MD_TABLES = (COLUMNS[:9] + ["bound"], COLUMNS[:4] + COLUMNS[9:13])
MD_HEADERS = {
    "MiB bf16": "MiB",
    "bits rs/ag": "bits",
    "wire MiB/rank": "wire MiB",
    "qnccl serial us": "serial",
    "qnccl overlap us": "overlap",
    "NCCL bf16 us": "NCCL bf16",
    "NCCL fp32 us": "NCCL fp32",
}
MD_LEGEND = (
    "columns: MiB = size of the bf16 message; bits = rs/ag; wire MiB = MiB each rank sends; "
    "serial, overlap = qnccl's predicted time (us); NCCL bf16, NCCL fp32 = NCCL's ring (us)"
)


def render(rows: List[List[str]], markdown: bool) -> str:
    if markdown:
        tables = []
        for cols in MD_TABLES:
            idx = [COLUMNS.index(c) for c in cols]
            head = [MD_HEADERS.get(c, c) for c in cols]
            tables.append(qbench.md_table(head, [[r[i] for i in idx] for r in rows]))
        return "\n\n".join(tables)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*COLUMNS)] + [fmt.format(*r) for r in rows])


def header(args, costs: KernelCosts, links: Sequence[Link], bits) -> List[str]:
    keys = [(rb, ab, costs.fused_key(rb, ab, args.symmetric)) for rb, ab in bits]
    fused = [f"{rb}/{ab}" for rb, ab, key in keys if key]
    kinds = sorted({key[0] for _, _, key in keys if key})
    lines = [
        "PREDICTED from one-GPU kernel timings, not measured on "
        f"{args.world} GPUs (benchmarks/COST_MODEL.md).",
        f"kernel costs: {' + '.join(os.path.relpath(p) for p in args.kernel_csv.split(','))} "
        f"x {costs.codec_scale:g} ({costs.rate}); "
        f"launch {costs.launch_us:g} us per call below the smallest measured size; HBM (copy) "
        f"{costs.hbm_gbps(64 * MIB):.0f}-{costs.hbm_gbps(1024 * MIB):.0f} GB/s read+write",
        "links: "
        + ", ".join(f"{lk.name} {lk.gbps:g} GB/s, alpha {lk.alpha_us:g} us/step" for lk in links),
        f"world {args.world}, group {args.group_size}, "
        f"{'symmetric' if args.symmetric else 'asymmetric'}, microshards {args.microshards}; "
        f"wire bytes from {ENCODED_BYTES_SOURCE}",
        "NCCL = ring, link and HBM traffic overlapped, 2(W-1) alpha; x = NCCL time / qnccl time; "
        "bound = larger of qnccl's link and codec totals",
    ]
    if fused:
        lines.append(
            "two_step codec term for bits "
            + ", ".join(fused)
            + " from the CSV's measured "
            + " and ".join(f"'{k}'" for k in kinds)
            + " rows (the whole two_step over CUDA IPC on one GPU)"
        )
    return lines


def markdown_header(head: Sequence[str]) -> str:
    """The header lines as a markdown list, each item wrapped at 100 characters."""
    items = [*head[:5], MD_LEGEND, *head[5:]]  # the legend after the NCCL line
    return "\n".join(
        textwrap.fill(
            h,
            100,
            initial_indent="* ",
            subsequent_indent="  ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        for h in items
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument(
        "--links",
        default="nvlink=370,pcie=25",
        help="name=GB/s[:alpha_us],... effective per-GPU bandwidth",
    )
    ap.add_argument("--alpha-us", type=float, default=3.0, help="default latency per step")
    ap.add_argument("--sizes-mib", default="1,16,64,256,1024", help="bf16 message sizes")
    ap.add_argument("--bits", default="8/8,4/8,4/4", help="rs/ag bit pairs")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS))
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--symmetric", action="store_true")
    ap.add_argument("--microshards", type=int, default=4)
    ap.add_argument("--launch-us", type=float, default=4.0)
    ap.add_argument(
        "--kernel-csv", default=DEFAULT_CSV, help="kernel times; several CSVs: comma-separated"
    )
    ap.add_argument(
        "--rate",
        choices=("interp", "closest"),
        default="interp",
        help="per-byte kernel cost between measured sizes: log-size interpolation or closest row",
    )
    ap.add_argument(
        "--codec-scale",
        type=float,
        default=1.0,
        help="multiply every measured kernel time (0.5 = kernels twice as fast, 0 = free)",
    )
    ap.add_argument("--markdown", default=None, help="also write the table as markdown here")
    args = ap.parse_args(argv)
    if args.world < 2:
        ap.error("--world must be at least 2")
    costs = KernelCosts.from_csv(
        args.kernel_csv, launch_us=args.launch_us, codec_scale=args.codec_scale, rate=args.rate
    )
    links = parse_links(args.links, args.alpha_us)
    sizes = [float(s) for s in args.sizes_mib.split(",")]
    bits = [tuple(int(b) for b in p.split("/")) for p in args.bits.split(",")]
    algos = [a.strip() for a in args.algorithms.split(",")]
    for a in algos:
        if a not in ALGORITHMS:
            ap.error(f"unknown algorithm {a!r}")
    rows = table(
        args.world,
        links,
        sizes,
        bits,
        costs,
        algos,
        args.group_size,
        args.symmetric,
        args.microshards,
    )
    head = header(args, costs, links, bits)
    print("\n".join("# " + h for h in head))
    print(render(rows, markdown=False))
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown_header(head) + "\n\n" + render(rows, True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
