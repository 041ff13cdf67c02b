"""The tests' names for qcomm.spawn: run_ranks (W CPU ranks, exit codes checked) and file_barrier
(a barrier between process groups, through files); and, for the fault tests, whose ranks die, stall
or sleep on purpose: first_answer, short_timeout_group and peer_fault.

Ranks start from a fork server with torch imported (multiprocessing's "forkserver"): a rank is a
fork of that server, not a new interpreter importing torch, which took 2-3 s of this machine's
two cores per call and was a third of the suite's time. Each rank is still a fresh process (no
state of an earlier test), given the caller's environment, stdout and stderr at the call
(qcomm.spawn.adopt_caller: pytest's capfd sees what ranks print)."""

import datetime
import functools
import os
import queue
import time

import torch.multiprocessing as mp

import qcomm.spawn
from qcomm.spawn import adopt_caller, caller_stdio, file_barrier  # noqa: F401

START_METHOD = "forkserver"
mp.get_context(START_METHOD).set_forkserver_preload(["torch", "torch.distributed"])

run_ranks = functools.partial(qcomm.spawn.run_ranks, start_method=START_METHOD)


def first_answer(target, world, *args, timeout=120):
    """Start target(rank, world, *args, out) in `world` spawned processes and return (the first
    thing one of them puts on the queue `out`, rank 0's exit code). Then rank 0 gets 60 s to end
    and the others are killed: a fault test's peer may be sleeping, stalled or gone already."""
    ctx = mp.get_context(START_METHOD)
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_as_caller,
            args=(dict(os.environ), caller_stdio(START_METHOD), target, r, world, *args, out),
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        answer = out.get(timeout=timeout)
    except queue.Empty:
        answer = None
    finally:
        procs[0].join(timeout=60)
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    assert answer is not None, f"no answer within {timeout} s (a hang?)"
    return answer, procs[0].exitcode


def _as_caller(environ, stdio, target, *args):
    """target(*args) with the caller's environment, stdout and stderr (qcomm.spawn.adopt_caller)."""
    adopt_caller(environ, stdio)
    target(*args)


def short_timeout_group(init_file, rank, world, seconds, config=None, barrier=True):
    """The default qnccl group over file://init_file with a timeout of `seconds` (a fault test's),
    `config` its QuantConfig; then a barrier, so that every rank is connected before the fault."""
    import torch.distributed as dist

    import qcomm  # noqa: F401  (registers qnccl)

    dist.init_process_group(
        "qnccl",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=seconds),
        pg_options=config,
    )
    if barrier:
        dist.barrier()


def peer_fault(mode, seconds):
    """The faulty peer: "dies" exits at once without a word; "stalls" sleeps past the timeout
    (`seconds`, four times over), then exits. Never returns."""
    if mode != "dies":
        time.sleep(seconds * 4)
    os._exit(0)
