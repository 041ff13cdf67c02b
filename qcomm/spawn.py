"""Run a function on W spawned CPU ranks of a qnccl (or other) process group; collect the results.

Used by the tests, the benchmarks and the examples.

Each rank is its own process (torch.multiprocessing, spawn), joined through a file:// store in a
fresh temporary folder; every exit code is checked, and a rank that raises fails the caller with
its traceback. A run that outlives `timeout` seconds is killed and reported as a hang.
"""

from __future__ import annotations

import os
import queue
import sys
import tempfile
import time
import traceback

import torch.multiprocessing as mp


def caller_stdio(start_method: str):
    """What a rank needs to write where the caller's stdout and stderr go now (a forkserver's child
    starts with the server's, not with the caller's, which pytest's capture may have replaced):
    None for "spawn", whose ranks inherit them."""
    if start_method == "spawn":
        return None
    from multiprocessing import resource_sharer

    sys.stdout.flush()
    sys.stderr.flush()
    return resource_sharer.DupFd(1), resource_sharer.DupFd(2)


def adopt_caller(environ, stdio) -> None:
    """In a rank: the caller's environment at the call, and its stdout and stderr (caller_stdio)."""
    if environ != os.environ:
        os.environ.clear()
        os.environ.update(environ)
    for target, handle in zip((1, 2), stdio or ()):
        fd = handle.detach()
        os.dup2(fd, target)
        os.close(fd)


def _entry(fn, rank, world, init_file, backend, pg_options, threads, args, out, environ, stdio):
    adopt_caller(environ, stdio)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    try:
        import qcomm  # noqa: F401  (registers qnccl)

        if backend is not None:
            dist.init_process_group(
                backend,
                init_method=f"file://{init_file}",
                rank=rank,
                world_size=world,
                pg_options=pg_options,
            )
        result = fn(rank, world, *args)
        if backend is not None and dist.is_initialized():
            dist.destroy_process_group()
        out.put((rank, "ok", result))
    except BaseException:  # noqa: BLE001 - reported to the parent with the traceback
        out.put((rank, "error", traceback.format_exc()))
        raise SystemExit(1) from None


def run_ranks(
    fn,
    world,
    *args,
    backend="qnccl",
    pg_options=None,
    timeout=180,
    threads=1,
    env=None,
    start_method="spawn",
):
    """Run fn(rank, world, *args) on `world` ranks; return the list of results by rank. Each rank
    starts with this process's environment, `env` added. start_method: multiprocessing's
    ("forkserver" with torch preloaded starts ranks in a fraction of spawn's time)."""
    ctx = mp.get_context(start_method)
    out = ctx.Queue()
    tmp = tempfile.mkdtemp(prefix="qcomm-test-")
    init_file = os.path.join(tmp, "store")
    environ = {**os.environ, **(env or {})}
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})  # a spawned rank's interpreter starts with it
    try:
        procs = [
            ctx.Process(
                target=_entry,
                args=(
                    fn,
                    r,
                    world,
                    init_file,
                    backend,
                    pg_options,
                    threads,
                    args,
                    out,
                    environ,
                    caller_stdio(start_method),
                ),  # fmt: skip
            )
            for r in range(world)
        ]
        for p in procs:
            p.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    results, errors = {}, []
    try:
        for _ in range(world):
            try:
                rank, status, payload = out.get(timeout=timeout)
            except queue.Empty:
                errors.append(f"timeout: no answer from some rank within {timeout} s (hang?)")
                break
            if status == "ok":
                results[rank] = payload
            else:
                errors.append(f"rank {rank} raised:\n{payload}")
                break
    finally:
        for p in procs:
            p.join(timeout=30 if not errors else 5)
            if p.is_alive():
                p.kill()
                p.join()
    codes = [p.exitcode for p in procs]
    if errors:
        raise AssertionError("\n".join(errors) + f"\nexit codes: {codes}")
    if any(c != 0 for c in codes):
        raise AssertionError(f"a rank exited abnormally: exit codes {codes}")
    return [results[r] for r in range(world)]


def file_barrier(tmp, name, rank, world, timeout=60.0):
    """Wait until every rank has reached `name`, without a process group: destroy_process_group is
    not collective, and a rank that opens the next group's Gloo mesh while a peer is still tearing
    down the last one can see its connection closed (seen once in a clean-clone run)."""
    open(os.path.join(tmp, f"{name}.{rank}"), "w").close()
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(os.path.join(tmp, f"{name}.{r}")) for r in range(world)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: not every rank reached {name} in {timeout} s")
        time.sleep(0.01)
