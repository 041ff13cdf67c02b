"""The benchmarks' library: what the scripts under benchmarks/ share, one module each.

    options    sizes (4M, 1G), dtypes, rs/ag bits, algorithms; the codec options; a row's config
    machine    where a run ran: the CPU model, cores, torch, the load average
    ranks      spawned CPU ranks: run_ranks (results collected), spawn (the main job's)
    cluster    ranks in network namespaces behind `tc tbf` rate limits (veth pairs), or loopback
    timing     a call's time as the slowest rank's; configurations interleaved; median and spread
    allreduce  the main job's deterministic inputs, its checked allreduce runner and its errors
    output     aligned and Markdown tables, CSV files

A script under benchmarks/ runs as ``python benchmarks/X.py``, so this folder is on its sys.path
and it imports the library as ``import qbench`` (a test adds benchmarks/ to sys.path likewise).
Importing the library puts the repository's root first on sys.path, so that ``import qcomm`` then
finds this checkout's package, in the script and in the ranks it spawns. Nothing here imports
torch or qcomm before a function needs it.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from .allreduce import Runner, bytes_view, errors, make_input  # noqa: E402
from .cluster import (  # noqa: E402
    PREFIX,
    SUBNET,
    add_cluster_args,
    dispatch,
    join,
    ns_names,
    run_local,
    run_workers,
    setup,
    teardown,
)
from .machine import cpu_model, load_average, system_lines  # noqa: E402
from .options import (  # noqa: E402
    DTYPES,
    ELEM_BYTES,
    add_codec_args,
    add_run_args,
    bits_label,
    check_run_args,
    make_config,
    parse_algorithms,
    parse_bits,
    parse_size,
    parse_sizes,
    size_label,
)
from .output import CsvLog, align_table, md_head, md_row, md_table, write_csv  # noqa: E402
from .ranks import RankFailed, run_ranks, spawn  # noqa: E402
from .timing import interleave, per_call_max, slowest, spread, timed_call  # noqa: E402

__all__ = [
    "CsvLog",
    "DTYPES",
    "ELEM_BYTES",
    "PREFIX",
    "ROOT",
    "RankFailed",
    "Runner",
    "SUBNET",
    "add_cluster_args",
    "add_codec_args",
    "add_run_args",
    "align_table",
    "bits_label",
    "check_run_args",
    "bytes_view",
    "cpu_model",
    "dispatch",
    "errors",
    "interleave",
    "join",
    "load_average",
    "make_config",
    "make_input",
    "md_head",
    "md_row",
    "md_table",
    "ns_names",
    "parse_algorithms",
    "parse_bits",
    "parse_size",
    "parse_sizes",
    "per_call_max",
    "run_local",
    "run_ranks",
    "run_workers",
    "setup",
    "size_label",
    "slowest",
    "spawn",
    "spread",
    "system_lines",
    "teardown",
    "timed_call",
    "write_csv",
]
