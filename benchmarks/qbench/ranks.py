"""Spawned CPU ranks on this host.

run_ranks: fn(rank, world, *args) on W ranks of an initialised process group (qcomm.spawn's:
results collected, exit codes checked). spawn: the main job's way, where the ranks make their own
groups and rank 0 reports through a queue (a rank that raises or dies ends the others).
"""

from __future__ import annotations

import os
import shutil
import tempfile


class RankFailed(RuntimeError):
    """A spawned rank raised or died (spawn's; the other ranks were ended)."""


def run_ranks(fn, world, *args, start_method="spawn", **kw):
    """fn(rank, world, *args) on `world` spawned ranks of a process group (qcomm.spawn.run_ranks:
    backend "qnccl" unless `backend` says otherwise, pg_options, timeout, threads, env); the
    results by rank. start_method "forkserver" starts the ranks from a server with torch imported
    (faster to start than "spawn", each rank still a fresh process)."""
    import torch.multiprocessing as mp

    from qcomm.spawn import run_ranks as _run_ranks

    if start_method == "forkserver":
        mp.get_context(start_method).set_forkserver_preload(["torch", "torch.distributed"])
    return _run_ranks(fn, world, *args, start_method=start_method, **kw)


def spawn(worker, world, *args, prefix="qbench-"):
    """worker(rank, world, *args, init_file, reports) on `world` spawned ranks
    (torch.multiprocessing, spawn): init_file is the path of a file:// store in a fresh temporary
    folder (removed at the end) for the ranks' init_process_group, reports a queue that the ranks
    may put results on.
    Returns what they put there, in order; raises RankFailed when a rank raised or died (the others
    are then ended). The worker must be importable by the children: a function of a module, or of
    the script run as __main__. The ranks' OpenMP pools are sized as they import torch: set
    OMP_NUM_THREADS before calling."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    tmp = tempfile.mkdtemp(prefix=prefix)
    ctx = mp.get_context("spawn")
    reports = ctx.SimpleQueue()
    try:
        pc = mp.start_processes(
            worker,
            args=(world, *args, os.path.join(tmp, "store"), reports),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
        try:
            while not pc.join():
                pass
        except ProcessException as e:
            raise RankFailed(str(e)) from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out = []
    while not reports.empty():
        out.append(reports.get())
    return out
