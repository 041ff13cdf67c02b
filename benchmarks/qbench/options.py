"""The command line's vocabulary, shared by the scripts: message sizes ('4M'), dtypes, rs/ag bit
pairs ('4/8'), algorithms, the codec and run options, and the QuantConfig of one row."""

from __future__ import annotations

import argparse
import re

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
ELEM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'256K' -> 262144, '4M' -> 4194304, '1G', '4096' (bytes); K/M/G are powers of 1024, a 'B'
    or 'iB' after them is allowed, and so is a fraction ('1.5G': rounded down to whole bytes)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([KkMmGg]?)(?:i?[Bb])?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use bytes like 4096, 256K, 4M or 1G")
    unit = _UNITS[m.group(2).upper()]
    number = m.group(1)
    n = int(number) * unit if number.isdigit() else int(float(number) * unit)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: must be positive")
    return n


def parse_sizes(text: str) -> list:
    """'1M,16M' -> [1048576, 16777216] (parse_size of each)."""
    return [parse_size(t) for t in text.split(",") if t.strip()]


def _parse_bits_one(text: str):
    t = text.strip().lower()
    if t in ("none", "-", "0", "raw"):
        return None
    if t in ("4", "8"):
        return int(t)
    raise argparse.ArgumentTypeError(f"bad bits {text!r}: use 4, 8 or none")


def parse_bits(text: str) -> list:
    """'8/8,4/8,4/4' -> [(8, 8), (4, 8), (4, 4)]; '8' means 8/8; 'none' ships the input dtype."""
    out = []
    for tok in text.split(","):
        tok = tok.strip()
        if not tok:
            continue
        parts = tok.split("/")
        if len(parts) == 1:
            parts = parts * 2
        if len(parts) != 2:
            raise argparse.ArgumentTypeError(f"bad bits pair {tok!r}: use RS/AG like 4/8")
        out.append((_parse_bits_one(parts[0]), _parse_bits_one(parts[1])))
    if not out:
        raise argparse.ArgumentTypeError("--bits is empty")
    return out


def parse_algorithms(text: str) -> list:
    """'two_step,ring' -> ['two_step', 'ring'], each checked against qcomm.ALGORITHMS."""
    from qcomm.config import ALGORITHMS

    algos = [a.strip().lower() for a in text.split(",") if a.strip()]
    for a in algos:
        if a not in ALGORITHMS:
            allowed = ", ".join(ALGORITHMS)
            raise argparse.ArgumentTypeError(f"bad algorithm {a!r}; allowed: {allowed}")
    if not algos:
        raise argparse.ArgumentTypeError("--algorithms is empty")
    return algos


def bits_label(pair) -> str:
    """(4, None) -> '4/none'."""
    return "/".join("none" if b is None else str(b) for b in pair)


def size_label(n: int) -> str:
    """1048576 -> '1M': the largest binary unit that divides n, else the number."""
    for unit in ("G", "M", "K"):
        if n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


def add_codec_args(p: argparse.ArgumentParser) -> None:
    """The codec and timing options of the main job and benchmarks/allreduce_sweep.py: --bits,
    --group-size, --symmetric, --microshards, --iters."""
    p.add_argument(
        "--bits",
        type=parse_bits,
        default=parse_bits("8/8,4/8,4/4"),
        help="rs/ag bit pairs, each 4, 8 or none (default 8/8,4/8,4/4)",
    )
    p.add_argument("--group-size", type=int, default=128, help="elements per scale (default 128)")
    p.add_argument("--symmetric", action="store_true", help="absmax scaling (default min/max)")
    p.add_argument(
        "--microshards", type=int, default=None, help="pieces per chunk (QuantConfig default)"
    )
    p.add_argument("--iters", type=int, default=5, help="timed calls per config (default 5)")


def add_run_args(p: argparse.ArgumentParser) -> None:
    """Warm-up, threads and seed, shared likewise."""
    p.add_argument("--warmup", type=int, default=1, help="untimed calls first (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--seed", type=int, default=1234, help="base seed of the inputs (default 1234)")


def check_run_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Refuses, through the parser's error, a negative --warmup, --threads below 1 and sizes that
    are not whole elements of --dtype (add_run_args' options and --sizes)."""
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    if a.threads < 1:
        p.error("--threads must be at least 1")
    eb = ELEM_BYTES[a.dtype]
    for s in a.sizes:
        if s % eb:
            p.error(f"size {s} is not a multiple of the {a.dtype} element size ({eb} bytes)")


def make_config(a, algo, rs, ag):
    """The QuantConfig of one row: the command line's codec knobs (add_codec_args), min_bytes 0."""
    from qcomm.config import QuantConfig

    kw = dict(
        algorithm=algo,
        rs_bits=rs,
        ag_bits=ag,
        group_size=a.group_size,
        symmetric=bool(a.symmetric),
        min_bytes=0,
    )
    if a.microshards is not None:
        kw["microshards"] = a.microshards
    return QuantConfig(**kw)
