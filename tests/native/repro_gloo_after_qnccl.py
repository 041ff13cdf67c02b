"""A known failure, reproduced: a Gloo group of several ranks created right after a destroyed
qnccl group sometimes fails to connect. Not a test (pytest does not collect it); run by hand:

    .venv/bin/python tests/native/repro_gloo_after_qnccl.py --first qnccl --iters 40
    .venv/bin/python tests/native/repro_gloo_after_qnccl.py --first gloo --iters 40
    .venv/bin/python tests/native/repro_gloo_after_qnccl.py --first wrapgloo --iters 60

3 ranks, each iteration: a default group of `--first` (env://; `wrapgloo`: a backend registered as
qnccl is, whose creator returns torch's own ProcessGroupGloo), an allreduce and a barrier on it,
destroy_process_group; a file barrier; a default Gloo group (file://), destroyed. It prints the
first failure, or "ok" per rank, and exits 1 on a failure. How often it failed here:
docs/reliability.md, "Known issue"; repro_gloo_destroy.py shows the same failure in plain torch.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def _port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _barrier(tmp: str, name: str, rank: int, world: int) -> None:
    open(f"{tmp}/{name}.{rank}", "w").close()
    while not all(os.path.exists(f"{tmp}/{name}.{r}") for r in range(world)):
        time.sleep(0.01)


def _rank(rank, world, args, ports, tmp, out):
    import qcomm  # noqa: F401  (registers qnccl)

    if args.first == "wrapgloo" and not hasattr(dist.Backend, "WRAPGLOO"):
        # a third-party backend that is nothing but torch's own ProcessGroupGloo: no qcomm code
        def create(opts, pg_options):
            store = dist.PrefixStore("gloo", opts.store)
            return dist.ProcessGroupGloo(store, opts.group_rank, opts.group_size, opts.timeout)

        dist.Backend.register_backend("wrapgloo", create, extended_api=True, devices=["cpu"])
    for i in range(args.iters):
        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(ports[i]),
            RANK=str(rank),
            WORLD_SIZE=str(world),
        )
        dist.init_process_group(args.first, init_method="env://")
        if not args.no_collectives:
            t = torch.ones(5)
            dist.all_reduce(t)
            dist.barrier()
        dist.destroy_process_group()
        _barrier(tmp, f"a{i}", rank, world)
        try:
            dist.init_process_group(
                "gloo", init_method=f"file://{tmp}/gloo{i}", rank=rank, world_size=world
            )
            dist.destroy_process_group()
        except RuntimeError as e:
            out.put((rank, f"iteration {i}: {e}"))
            out.close()
            out.join_thread()  # the message is sent before the exit
            os._exit(3)  # the other ranks may be waiting on this group: do not wait for them
        _barrier(tmp, f"b{i}", rank, world)
    out.put((rank, "ok"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--first", choices=("qnccl", "gloo", "wrapgloo"), default="qnccl")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--world", type=int, default=3)
    ap.add_argument("--no-collectives", action="store_true")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="qcomm-gloo-after-")
    ports = [_port() for _ in range(args.iters)]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_rank, args=(r, args.world, args, ports, tmp, out))
        for r in range(args.world)
    ]
    for p in procs:
        p.start()
    first = out.get(timeout=60 + 10 * args.iters)
    print(f"rank {first[0]}: {first[1]}", flush=True)
    failed = first[1] != "ok"
    if not failed:
        for _ in range(args.world - 1):
            rank, msg = out.get(timeout=60 + 10 * args.iters)
            print(f"rank {rank}: {msg}", flush=True)
            failed = failed or msg != "ok"
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
