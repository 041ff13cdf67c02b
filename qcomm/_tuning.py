"""The tuner's cache and its tables (the measurement itself runs in C++: csrc/backend/tuner.cpp).

A group whose config has ``tune`` loads, at its creation, the choices a cache file holds for its
key (what the timings depend on: world size, hosts, device kind, inner backend, the config's bits
and groups, the codec's threads and instruction set, the qcomm and torch versions). Rank 0 reads
the file and shares its entries through the group's store, so every rank holds the same table; a
file that is unreadable, of another format or of another key is ignored with a warning. After
each measurement rank 0 writes the whole table back.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Optional

import torch

from . import _C

#: dtype code (csrc/common/dtype.h) -> torch dtype
DTYPES = {0: torch.float32, 1: torch.float16, 2: torch.bfloat16}
CODES = {v: k for k, v in DTYPES.items()}
DTYPE_NAMES = {0: "float32", 1: "float16", 2: "bfloat16"}
FORMAT = 1


def cache_key(cfg, world: int, hosts: list, threads: int, version: str) -> dict:
    """What a measured choice depends on; a cache file of another key is not used."""
    return {
        "qcomm": version,
        "torch": torch.__version__.split("+")[0],
        "world": world,
        "hosts": hosts,
        "device": "cpu",
        "inner": "gloo",
        "cpu_isa": _C.cpu_isa(),
        "cpu_threads": threads,
        "rs_bits": cfg.rs_bits,
        "ag_bits": cfg.ag_bits,
        "group_size": cfg.group_size,
        "symmetric": cfg.symmetric,
        "rotate": cfg.rotates,
        "stochastic_rounding": cfg.stochastic_rounding,
        "min_bytes": cfg.min_bytes,
    }


def cache_path(key: dict) -> str:
    """QCOMM_TUNE_FILE when set, else ~/.cache/qcomm/tune-<hash of the key>.json (under
    $XDG_CACHE_HOME when that is set)."""
    chosen = _C.setting("QCOMM_TUNE_FILE")["text"]
    if chosen:
        return os.path.expanduser(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(base, "qcomm", f"tune-{digest}.json")


def _entry_tuple(e: dict) -> list:
    """An entry of the file as load_tuning takes it; raises ValueError when it is not one."""
    from .config import ALGORITHMS

    dtype = {n: c for c, n in DTYPE_NAMES.items()}[e["dtype"]]
    algo = "none" if e["algorithm"] == "none" else e["algorithm"]
    if algo not in ("none", "two_step", "ring", "semi_ring"):
        raise ValueError(f"algorithm {algo!r}")
    values = [dtype, int(e["size_class"]), int(e["bytes"]), ALGORITHMS[algo], int(e["microshards"])]
    if not (0 <= values[1] < 63 and 1 <= values[4] <= 64 and values[2] >= 0):
        raise ValueError("a field out of range")
    return values


def read_cache(path: str, key: dict):
    """(entries, None) from the file at `path` when it holds a table of `key`; ([], why) when it
    does not exist (why None) or cannot be trusted (why says what is wrong)."""
    if not os.path.exists(path):
        return [], None
    try:
        with open(path) as f:
            doc = json.load(f)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            return [], f"it is not a qcomm tuning table of format {FORMAT}"
        if doc.get("key") != key:
            theirs = doc.get("key") if isinstance(doc.get("key"), dict) else {}
            differ = sorted(k for k in set(key) | set(theirs) if key.get(k) != theirs.get(k))
            return [], "it was measured for another set-up (differs in: " + ", ".join(differ) + ")"
        return [_entry_tuple(e) for e in doc["entries"]], None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return [], f"it cannot be read ({type(e).__name__}: {e})"


def install(backend, store, rank: int, size: int, cfg, key: dict) -> None:
    """At a group's creation with cfg.tune: rank 0 reads the cache and shares its entries through
    the store; every rank loads them; rank 0 will write the table back after each measurement."""
    path = cache_path(key)
    name = "qcomm_tune/entries"
    if rank == 0:
        entries, why = read_cache(path, key)
        if why:
            print(
                f"[qcomm rank 0/{size}] WARN the tuning cache {path} is ignored: {why}; the "
                "classes will be measured again and the file rewritten",
                file=sys.stderr,
                flush=True,
            )
        store.set(name, json.dumps(entries))
        try:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        except OSError:
            pass  # the write says so, once a measurement has something to write
    entries = json.loads(store.get(name).decode())
    backend.load_tuning([tuple(e) for e in entries])
    backend.set_tuning_cache(path if rank == 0 else "", json.dumps(key, sort_keys=True))


def table(backend, cuda: bool = False) -> list:
    """The backend's tuning table (of CUDA tensors where `cuda`), dtypes and candidates by
    name."""
    out = []
    for e in backend.tuning(cuda):
        out.append(
            {
                "dtype": DTYPE_NAMES[e["dtype"]],
                "size_class": e["size_class"],
                "bytes": e["bytes"],
                "choice": e["choice"],
                "seconds": dict(e["seconds"]),
            }
        )
    return out


def human(n: int) -> str:
    """Bytes as the columns print them: 1 MiB, 256 KiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def format_table(entries: list, out: Optional[list] = None) -> str:
    """The table in nccl-tests-style columns: one row per dtype and size, each candidate's time
    in ms, the choice, and exact's time over the choice's."""
    if not entries:
        return "(no size class tuned)"
    names = []
    for e in entries:
        for n in e["seconds"]:
            if n not in names:
                names.append(n)
    head = f"{'size':>10} {'dtype':>9} " + " ".join(f"{n:>12}" for n in names)
    lines = [head + f" {'choice':>13} {'speed-up':>8}", "-" * (len(head) + 23)]
    for e in entries:
        row = f"{human(e['bytes']):>10} {e['dtype']:>9} "
        row += " ".join(
            f"{e['seconds'][n] * 1e3:>12.3f}" if n in e["seconds"] else f"{'-':>12}" for n in names
        )
        gain = e["seconds"]["exact"] / e["seconds"][e["choice"]]
        lines.append(row + f" {e['choice']:>13} {gain:>7.2f}x")
    lines.append("times in ms: the maximum over ranks of each rank's median of 3-15 runs")
    return "\n".join(lines)
