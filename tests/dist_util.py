"""The tests' names for qcomm.spawn: run_ranks (W spawned CPU ranks, exit codes checked) and
file_barrier (a barrier between process groups, through files); and first_answer, for the fault
tests, whose ranks die, stall or sleep on purpose."""

import queue

import torch.multiprocessing as mp

from qcomm.spawn import file_barrier, run_ranks  # noqa: F401


def first_answer(target, world, *args, timeout=120):
    """Start target(rank, world, *args, out) in `world` spawned processes and return (the first
    thing one of them puts on the queue `out`, rank 0's exit code). Then rank 0 gets 60 s to end
    and the others are killed: a fault test's peer may be sleeping, stalled or gone already."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, *args, out)) for r in range(world)]
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
