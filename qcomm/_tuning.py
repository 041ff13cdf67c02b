"""The tuner's cache and its tables (the measurement itself runs in C++: csrc/backend/tuner.cpp).

A group whose config has ``tune`` loads, at its creation, the choices a cache file holds for its
key (what the timings depend on: the network path its inner Gloo connected over, world size,
hosts, device kind, inner backend, the config's bits and groups, the codec's threads and
instruction set, the qcomm and torch versions). Rank 0 reads the file and shares its entries
through the group's store, so every rank holds the same table; a file that is unreadable, of
another format or of another key, or whose entries are malformed, is ignored with a warning that
names the file and what is wrong; a path that is not a regular file (a device node, FIFO, symlink
or directory) is neither read nor written. After each measurement rank 0 writes the whole table
back. An entry loaded from the cache is checked at the first call of its class before the group
relies on it (tuner.cpp).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import stat
import sys
from typing import Optional

import torch

from . import _C

#: dtype code (csrc/common/dtype.h) -> torch dtype
DTYPES = {0: torch.float32, 1: torch.float16, 2: torch.bfloat16}
CODES = {v: k for k, v in DTYPES.items()}
DTYPE_NAMES = {0: "float32", 1: "float16", 2: "bfloat16"}
#: collective code (csrc/plan/plan.h Collective) -> its name (stats()["by_collective"]'s keys)
COLLECTIVE_NAMES = {0: "all_reduce", 1: "reduce_scatter", 2: "all_gather"}
#: the format written. Format 2 entries name their collective; a format-1 file (written before
#: reduce-scatters and all-gathers were tuned) holds allreduce entries only and is read as such.
FORMAT = 2
READ_FORMATS = (1, 2)
#: the largest cache file read (a table of every class of three dtypes is a few KiB)
MAX_BYTES = 1 << 20
ALGOS = ("two_step", "ring", "semi_ring")
#: group name -> (cache path, key) of each group created with tune (python -m qcomm.tune shows it)
KEYS: dict = {}


# ---- the network path --------------------------------------------------------------------------


def _socket_inodes() -> set:
    """The inodes of this process's open sockets (Linux; empty elsewhere)."""
    out = set()
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(link[8:-1])
    return out


def _proc_ip(hexaddr: str) -> str:
    """An address as /proc/net/tcp{,6} prints it (32-bit words in host order) in text."""
    raw = bytes.fromhex(hexaddr)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw)
    ip = socket.inet_ntop(socket.AF_INET6, raw)
    return ip[7:] if ip.startswith("::ffff:") and "." in ip else ip


def _connections(inodes: set) -> list:
    """The (local address, peer address) pairs of the established TCP sockets among `inodes`."""
    pairs = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/self/net/{name}") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[9] not in inodes or fields[3] != "01":
                continue
            try:
                pairs.add((_proc_ip(fields[1].split(":")[0]), _proc_ip(fields[2].split(":")[0])))
            except (ValueError, OSError):
                continue
    return sorted([list(p) for p in pairs])


def _declared_address() -> dict:
    """Where Gloo's default device binds when its connections cannot be read (lazy init, no
    /proc): the interfaces GLOO_SOCKET_IFNAME names, else the first address this host's name
    resolves to that can be bound, else the loopback address (as torch's createDefaultDevice)."""
    ifname = os.environ.get("GLOO_SOCKET_IFNAME", "")
    if len(ifname) > 1:
        return {"interfaces": ifname}
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM)
    except OSError:
        infos = []
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind((addr[0], 0))
            return {"bind": addr[0]}
        except OSError:
            continue
    return {"bind": "127.0.0.1"}


def connect_recording(make):
    """Runs make() (which creates a Gloo process group: it connects to every peer) and returns
    (its result, this rank's path): {"connections": [[local, peer], ...]}, the addresses of the
    TCP connections it opened (ports aside), or, where none can be read, _declared_address()."""
    before = _socket_inodes()
    made = make()
    pairs = _connections(_socket_inodes() - before)
    return made, ({"connections": pairs} if pairs else _declared_address())


def agree_path(store, rank: int, size: int, mine: dict) -> list:
    """Every rank's path (connect_recording), by rank, through the group's store: the same list
    on every rank."""
    key = "qcomm_path/"
    store.set(key + str(rank), json.dumps(mine, sort_keys=True))
    return [json.loads(store.get(key + str(r)).decode()) for r in range(size)]


# ---- the key and the file ----------------------------------------------------------------------


def cache_key(cfg, world: int, hosts: list, threads: int, version: str, path=None) -> dict:
    """What a measured choice depends on; a cache file of another key is not used. `path`: every
    rank's network path (agree_path)."""
    return {
        "qcomm": version,
        "torch": torch.__version__.split("+")[0],
        "world": world,
        "hosts": hosts,
        "path": path if path is not None else [],
        "device": "cpu",
        "inner": "gloo",
        "cpu_isa": _C.cpu_isa(),
        "cpu_threads": threads,
        # the fields declared as keying the table (csrc/plan/config.h QCOMM_CONFIG_FIELDS), and
        # each collective's rotation as its plan decides it: with rotate unset a reduce-scatter
        # and an all-gather rotate by their own phase's bits, not by the allreduce's rule (the
        # same rule as QncclBackend::setConfig's, plan.h sameTuningKey)
        **{f["name"]: getattr(cfg, f["name"]) for f in _C.config_fields() if f["tuning_key"]},
        "rotate": [cfg.rotates_for(c) for c in ("all_reduce", "reduce_scatter", "all_gather")],
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


def not_regular(path: str) -> Optional[str]:
    """What `path` is when something other than a regular file is there (a symlink is not
    followed): "a FIFO", "a character device", ...; None when it is a regular file or absent."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"unreadable ({e.strerror})"
    for test, what in (
        (stat.S_ISREG, None),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return what
    return "not a regular file"


class _Bad(ValueError):
    """A malformed entry: the message names the entry and the field."""


def _int_field(e: dict, i: int, name: str, lo: int, hi: int) -> int:
    v = e.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _Bad(f"entry {i}, field {name!r}: {v!r:.40} is not an integer in [{lo}, {hi}]")
    return v


def _choice_code(name: str, i: int):
    """(algorithm code, microshards) of a candidate's name: "exact", "ring/4"."""
    from .config import ALGORITHMS

    if name == "exact":
        return ALGORITHMS["none"], 1
    algo, _, shards = name.partition("/")
    if algo not in ALGOS or not shards.isdigit() or not 1 <= int(shards) <= 64:
        raise _Bad(f"entry {i}, field 'seconds': {name!r:.40} is not a candidate")
    return ALGORITHMS[algo], int(shards)


def _entry_tuple(e, i: int = 0) -> list:
    """An entry of the file as load_tuning takes it: [dtype, size class, bytes, algorithm,
    microshards, [[algorithm, microshards, seconds], ...], collective]; raises _Bad naming the
    field. An entry without "collective" (format 1) is an allreduce's."""
    from .config import ALGORITHMS

    if not isinstance(e, dict):
        raise _Bad(f"entry {i} is not an object")
    names = {n: c for c, n in DTYPE_NAMES.items()}
    if not isinstance(e.get("dtype"), str) or e["dtype"] not in names:
        raise _Bad(f"entry {i}, field 'dtype': {e.get('dtype')!r:.40} is not a dtype")
    algo = e.get("algorithm")
    if not isinstance(algo, str) or algo not in ("none",) + ALGOS:
        raise _Bad(f"entry {i}, field 'algorithm': {algo!r:.40} is not an algorithm")
    values = [
        names[e["dtype"]],
        _int_field(e, i, "size_class", 0, 62),
        _int_field(e, i, "bytes", 0, 1 << 62),
        ALGORITHMS[algo],
        _int_field(e, i, "microshards", 1, 64),
    ]
    seconds = e.get("seconds", {})
    if not isinstance(seconds, dict):
        raise _Bad(f"entry {i}, field 'seconds' is not an object")
    times = []
    for name, sec in seconds.items():
        code, shards = _choice_code(name, i)
        if isinstance(sec, bool) or not isinstance(sec, (int, float)):
            raise _Bad(f"entry {i}, field 'seconds', {name!r}: {sec!r:.40} is not a number")
        if not (math.isfinite(sec) and 0 <= sec < 1e6):
            raise _Bad(f"entry {i}, field 'seconds', {name!r}: {sec!r:.40} is out of range")
        times.append([code, shards, float(sec)])
    values.append(times)
    coll = e.get("collective", "all_reduce")
    codes = {n: c for c, n in COLLECTIVE_NAMES.items()}
    if not isinstance(coll, str) or coll not in codes:
        raise _Bad(f"entry {i}, field 'collective': {coll!r:.40} is not a collective")
    values.append(codes[coll])
    return values


def _reject_constant(name: str):
    raise _Bad(f"it holds {name}, which is not JSON")


def read_cache(path: str, key: dict):
    """(entries, None) from the file at `path` when it holds a table of `key`; ([], why) when it
    does not exist (why None) or cannot be trusted (why says what is wrong: the field, for a
    malformed entry). Never raises, never blocks on a FIFO, never follows a symlink."""
    kind = not_regular(path)
    if kind:
        return [], f"it is {kind}, not a regular file"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return [], None
    except OSError as e:
        return [], f"it cannot be opened ({e.strerror})"
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return [], "it is not a regular file"
            data = f.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            return [], f"it is larger than {MAX_BYTES} bytes"
        doc = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
        if not isinstance(doc, dict) or doc.get("format") not in READ_FORMATS:
            formats = " or ".join(str(f) for f in READ_FORMATS)
            return [], f"it is not a qcomm tuning table of format {formats}"
        if doc.get("key") != key:
            theirs = doc.get("key") if isinstance(doc.get("key"), dict) else {}
            differ = sorted(k for k in set(key) | set(theirs) if key.get(k) != theirs.get(k))
            return [], "it was measured for another set-up (differs in: " + ", ".join(differ) + ")"
        entries = doc.get("entries")
        if not isinstance(entries, list):
            return [], "its field 'entries' is not a list"
        return [_entry_tuple(e, i) for i, e in enumerate(entries)], None
    except _Bad as e:
        return [], str(e)
    except RecursionError:
        return [], "it is nested too deeply to be a tuning table"
    except Exception as e:  # noqa: BLE001 - any malformed content is a reason to ignore the file
        return [], f"it cannot be read ({type(e).__name__}: {str(e)[:200]})"


def _warn(size: int, msg: str) -> None:
    print(f"[qcomm rank 0/{size}] WARN {msg}", file=sys.stderr, flush=True)


def install(backend, store, rank: int, size: int, cfg, key: dict, group: str = "") -> None:
    """At a group's creation with cfg.tune: rank 0 reads the cache and shares its entries through
    the store (whatever happens while it reads: no rank waits for the store's timeout); every rank
    loads them; rank 0 will write the table back after each measurement, unless the path is not
    a regular file."""
    path = cache_path(key)
    KEYS[group] = (path, key)
    name = "qcomm_tune/entries"
    writable = True
    if rank == 0:
        entries = []
        try:
            kind = not_regular(path)
            if kind:
                writable = False
                _warn(
                    size,
                    f"the tuning cache {path} is {kind}, not a regular file: it is neither read "
                    "nor written (the choices stay in memory); point QCOMM_TUNE_FILE at a file",
                )
            else:
                entries, why = read_cache(path, key)
                if why:
                    _warn(
                        size,
                        f"the tuning cache {path} is ignored: {why}; the classes will be "
                        "measured again and the file rewritten",
                    )
                try:
                    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                except OSError:
                    pass  # the write says so, once a measurement has something to write
        finally:
            store.set(name, json.dumps(entries))
    entries = json.loads(store.get(name).decode())
    backend.load_tuning([tuple(e) for e in entries])
    backend.set_tuning_cache(
        path if rank == 0 and writable else "", json.dumps(key, sort_keys=True)
    )


def drop(path: str) -> str:
    """Removes the cache file at `path` (a regular file only); says what it did."""
    kind = not_regular(path)
    if kind:
        return f"{path} is {kind}, not a tuning cache: left alone"
    try:
        os.unlink(path)
    except FileNotFoundError:
        return f"{path}: no such file"
    return f"removed {path}"


def table(backend) -> list:
    """The backend's tuning table, dtypes and candidates by name."""
    out = []
    for e in backend.tuning():
        out.append(
            {
                "collective": COLLECTIVE_NAMES[e.get("collective", 0)],
                "dtype": DTYPE_NAMES[e["dtype"]],
                "size_class": e["size_class"],
                "bytes": e["bytes"],
                "choice": e["choice"],
                "seconds": dict(e["seconds"]),
                "verified": e["verified"],
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
    in ms ("-" where there is none: not measured, or an entry without times), the choice, and
    exact's time over the choice's."""
    if not entries:
        return "(no size class tuned)"
    names = []
    for e in entries:
        for n in e.get("seconds", {}):
            if n not in names:
                names.append(n)
    head = f"{'collective':>14} {'size':>10} {'dtype':>9} " + " ".join(f"{n:>12}" for n in names)
    lines = [head + f" {'choice':>13} {'speed-up':>8}", "-" * (len(head) + 23)]
    for e in entries:
        sec = e.get("seconds", {})
        coll = e.get("collective", "all_reduce")
        row = f"{coll:>14} {human(e['bytes']):>10} {e['dtype']:>9} "
        row += " ".join(f"{sec[n] * 1e3:>12.3f}" if n in sec else f"{'-':>12}" for n in names)
        if sec.get("exact") and sec.get(e["choice"]):
            gain = f"{sec['exact'] / sec[e['choice']]:>7.2f}x"
        else:
            gain = f"{'-':>8}"
        lines.append(row + f" {e['choice']:>13} {gain}")
    lines.append("times in ms: the maximum over ranks of each rank's median of 3-15 runs")
    return "\n".join(lines)
