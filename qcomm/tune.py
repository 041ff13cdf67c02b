"""``python -m qcomm.tune``: measure, on this machine's link, what qnccl's ``auto`` should do at
each message size, print the table and write the cache that later groups of the same set-up load.

Under torchrun (RANK and WORLD_SIZE set) it tunes the job's ranks; otherwise it spawns ``--world``
ranks on this host. The quantization settings come from the QCOMM_* environment as for any group.
``--device cuda`` (torchrun only, one GPU a rank: the exact candidate is NCCL's, and NCCL refuses
two ranks on one GPU) tunes the CUDA allreduces of each rank's GPU, cuda:(LOCAL_RANK % GPUs), with
QCOMM_CUDA_QUANTIZE=1; their table lives in the group (the cache holds host-memory choices only).
"""

from __future__ import annotations

import argparse
import os
import sys
import types

import torch

from qcomm.bench import parse_size


def _worker(rank: int, world: int, args) -> None:
    import torch.distributed as dist

    import qcomm

    cuda = args.device == "cuda"
    if cuda:
        os.environ["QCOMM_CUDA_QUANTIZE"] = "1"  # the quantized CUDA path is opt-in
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local % torch.cuda.device_count())
    if not dist.is_initialized():
        dist.init_process_group("qnccl", rank=rank, world_size=world)
    dtypes = [getattr(torch, d) for d in args.dtypes]
    sizes = None
    if args.min_size or args.max_size:
        lo, hi = args.min_size or 1 << 20, args.max_size or 64 << 20
        sizes, n = [], lo
        while n <= hi:
            sizes.append(n)
            n <<= 1
    table = qcomm.tune(sizes=sizes, dtypes=dtypes, device=args.device)
    if rank == 0:
        from qcomm import _tuning

        where = f"CUDA ({torch.cuda.get_device_name()})" if cuda else "host memory"
        print(f"qcomm.tune: {world} ranks, {where}, config {qcomm.get_config()}")
        print(_tuning.format_table(table))
        s = qcomm.stats()
        print(f"tuning took {s['tune_seconds']:.1f} s for {s['tuned_classes']} size classes")
        if cuda:
            print("cache: none (CUDA choices live in the group)", flush=True)
        else:
            path = qcomm.backend_of().tuning_cache()
            print(f"cache: {path or '(none: the config does not tune)'}", flush=True)
    dist.destroy_process_group()


def main(argv=None) -> int:
    """The command line (see the module's docstring)."""
    p = argparse.ArgumentParser(prog="python -m qcomm.tune", description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2, help="ranks to spawn without torchrun")
    p.add_argument("--min-size", type=parse_size, default=0, help="smallest size (4096, 256K, 1M)")
    p.add_argument("--max-size", type=parse_size, default=0, help="largest size (default 64M)")
    p.add_argument("--dtypes", nargs="+", default=["float32"], help="float32 float16 bfloat16")
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu: host-memory allreduces (default); cuda: each rank's GPU, under torchrun only",
    )
    args = p.parse_args(argv)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if args.device == "cuda":
        import qcomm

        if not launched:
            p.error(
                "--device cuda runs under torchrun, one rank a GPU: torchrun --standalone "
                "--nproc_per_node=GPUS -m qcomm.tune --device cuda"
            )
        if not (torch.cuda.is_available() and qcomm.compiled_with_cuda()):
            p.error("--device cuda needs a CUDA device and qcomm's CUDA build")
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
