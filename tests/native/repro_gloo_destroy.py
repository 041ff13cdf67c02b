"""The known Gloo connect failure, reduced to plain torch (nothing of qcomm is imported, here or in
the ranks). Not a test (pytest does not collect it); run by hand:

    .venv/bin/python tests/native/repro_gloo_destroy.py --iters 100

3 ranks, each iteration: a default Gloo group (file://, a fresh file), destroyed at once with no
collective run on it, then a file barrier. It prints the first failure, or "ok" per rank, and
exits 1 on a failure. docs/reliability.md, "Known issue", says how often it failed here.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch.distributed as dist
import torch.multiprocessing as mp


def _barrier(tmp: str, name: str, rank: int, world: int) -> None:
    open(f"{tmp}/{name}.{rank}", "w").close()
    while not all(os.path.exists(f"{tmp}/{name}.{r}") for r in range(world)):
        time.sleep(0.01)


def _rank(rank, world, iters, collective, tmp, out):
    for i in range(iters):
        try:
            dist.init_process_group(
                "gloo", init_method=f"file://{tmp}/g{i}", rank=rank, world_size=world
            )
            if collective:
                dist.barrier()
            dist.destroy_process_group()
        except RuntimeError as e:
            out.put((rank, f"iteration {i}: {e}"))
            out.close()
            out.join_thread()
            os._exit(3)  # the other ranks may be waiting on this group: do not wait for them
        _barrier(tmp, f"b{i}", rank, world)
    out.put((rank, "ok"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--world", type=int, default=3)
    ap.add_argument("--collective", action="store_true", help="a barrier before each destroy")
    args = ap.parse_args()
    assert "qcomm" not in sys.modules
    tmp = tempfile.mkdtemp(prefix="gloo-destroy-")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_rank, args=(r, args.world, args.iters, args.collective, tmp, out))
        for r in range(args.world)
    ]
    for p in procs:
        p.start()
    failed = False
    for _ in range(args.world):
        rank, msg = out.get(timeout=60 + 10 * args.iters)
        print(f"rank {rank}: {msg}", flush=True)
        if msg != "ok":
            failed = True
            break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
