"""``python -m qcomm.tune``: measure, on this machine's link, what qnccl's ``auto`` should do at
each message size of host-memory allreduces (``--collective``: also or instead reduce-scatters and
all-gathers), print the table and write the cache that later groups of the same set-up (network
path included) load.

Under torchrun (RANK and WORLD_SIZE set) it tunes the job's ranks; otherwise it spawns ``--world``
ranks on this host. The quantization settings come from the QCOMM_* environment as for any group.
``--show`` prints the cache's key, its file and the entries it holds, measuring nothing; ``--drop``
removes that file. The tuner is for host memory only: a CUDA allreduce with ``auto`` runs two_step.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import types

import torch

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """'256K' -> 262144, '4M' -> 4194304, '1G', '4096' (bytes); K/M/G are powers of 1024."""
    m = re.fullmatch(r"\s*(\d+)\s*([KkMmGg]?)(?:i?[Bb])?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use bytes like 4096, 256K, 4M or 1G")
    n = int(m.group(1)) * _UNITS[m.group(2).upper()]
    if n <= 0:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: must be positive")
    return n


def _worker(rank: int, world: int, args) -> None:
    import torch.distributed as dist

    import qcomm
    from qcomm import _tuning

    if not dist.is_initialized():
        # the tuner's cache and key exist only where the config tunes
        dist.init_process_group(
            "qnccl", rank=rank, world_size=world, pg_options=qcomm.from_env().replace(tune=True)
        )
    # the sharded collectives named are quantized (not part of the cache's key: the table and its
    # file stay the group's)
    cfg = qcomm.get_config()
    rs = cfg.reduce_scatter or "reduce_scatter" in args.collective
    ag = cfg.all_gather or "all_gather" in args.collective
    if (rs, ag) != (cfg.reduce_scatter, cfg.all_gather):
        qcomm.set_config(cfg.replace(reduce_scatter=rs, all_gather=ag))
    path, key = _tuning.KEYS.get(dist.group.WORLD.group_name, ("", None))
    if args.show or args.drop:
        if rank == 0:
            print(f"key: {json.dumps(key, sort_keys=True)}")
            print(f"cache: {path}")
            print(_tuning.format_table(qcomm.tuning()))
            if args.drop:
                print(_tuning.drop(path), flush=True)
        dist.destroy_process_group()
        return
    dtypes = [getattr(torch, d) for d in args.dtypes]
    sizes = None
    if args.min_size or args.max_size:
        lo, hi = args.min_size or 1 << 20, args.max_size or 64 << 20
        sizes, n = [], lo
        while n <= hi:
            sizes.append(n)
            n <<= 1
    table = qcomm.tune(sizes=sizes, dtypes=dtypes, collectives=args.collective)
    if rank == 0:
        print(f"qcomm.tune: {world} ranks, host memory, config {qcomm.get_config()}")
        print(f"key: {json.dumps(key, sort_keys=True)}")
        print(_tuning.format_table(table))
        s = qcomm.stats()
        print(f"tuning took {s['tune_seconds']:.1f} s for {s['tuned_classes']} size classes")
        written = qcomm.backend_of().tuning_cache()
        print(
            f"cache: {written or '(none: ' + (path or 'no file') + ' is not written)'}", flush=True
        )
    dist.destroy_process_group()


def main(argv=None) -> int:
    """The command line (see the module's docstring)."""
    p = argparse.ArgumentParser(prog="python -m qcomm.tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2, help="ranks to spawn without torchrun")
    p.add_argument("--min-size", type=parse_size, default=0, help="smallest size (4096, 256K, 1M)")
    p.add_argument("--max-size", type=parse_size, default=0, help="largest size (default 64M)")
    p.add_argument("--dtypes", nargs="+", default=["float32"], help="float32 float16 bfloat16")
    p.add_argument(
        "--collective",
        nargs="+",
        choices=("all_reduce", "reduce_scatter", "all_gather"),
        default=["all_reduce"],
        help="the collectives to tune (a size is the message: the reduce-scatter's input, the "
        "all-gather's output)",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu: host-memory allreduces (the only ones tuned; cuda is refused)",
    )
    p.add_argument("--show", action="store_true", help="print the key and the cached entries")
    p.add_argument("--drop", action="store_true", help="remove the cache file of this set-up")
    args = p.parse_args(argv)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if args.device == "cuda":
        p.error(
            "the tuner measures host-memory allreduces only; a CUDA allreduce with "
            "algorithm='auto' runs two_step, untuned"
        )
    if launched:
        _worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return 0
    from qcomm.spawn import run_ranks

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    run_ranks(_worker, args.world, args, timeout=3600, threads=max(1, (cores or 1) // args.world))
    return 0


class _CallableModule(types.ModuleType):
    """``qcomm.tune`` is also the function: importing this module binds it to qcomm's attribute,
    so the module forwards calls to the function."""

    def __call__(self, *args, **kwargs):
        return sys.modules["qcomm"]._tune(*args, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
else:
    sys.modules[__name__].__class__ = _CallableModule
