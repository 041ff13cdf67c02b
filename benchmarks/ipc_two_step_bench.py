"""Cost of the CUDA-IPC two_step on one GPU, the separate kernels (QCOMM_IPC_KERNELS=separate,
the transport's default and this benchmark's) or the fused kernel (--kernels fused: the
experiment of csrc/experiments/ipc_fused/, in a QCOMM_EXPERIMENTS=1 build only): W ranks as
threads of one process, each with its own stream, so their kernels run side by side on the one
GPU (processes sharing a GPU would time-slice instead, and their timings would mean nothing).

All W ranks share one GPU's memory bandwidth and SMs, so the time measured here is the time to
allreduce W messages on one chip: on a node with one GPU per rank, each GPU does 1/W of this work.
We report it as a cost per byte of one rank's message (time / (W x bytes)) beside the device-to-
device copy of the same bytes (time for W copies of the message); the cost model
(benchmarks/cost_model.py) reads the `fused_two_step` (or `separate_two_step`) rows of the CSV.

    python benchmarks/ipc_two_step_bench.py --world 2 --sizes-mib 16,64,256 --csv out.csv
    python benchmarks/ipc_two_step_bench.py --world 2 --sizes-mib 16,64,256 --kernels fused
    python benchmarks/ipc_two_step_bench.py --world 2 --sizes-mib 64 --kernels fused --profile

--profile (QCOMM_IPC_PROFILE=1; the fused kernel only) also prints where rank 0's kernel spent its
time in the timed calls: each phase's share of the cycles summed over task groups
(QCOMM_IPC_TASK_WARPS warps of a block each; default the whole block), and cycles per task group
and piece.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import threading

# before CUDA starts: a hardware queue for each rank's stream, so that no rank's kernel waits in a
# queue behind a peer's kernel that waits for it (CUDA's default is 8 queues)
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

import qbench  # noqa: E402  (puts this checkout's qcomm first on sys.path)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import qcomm  # noqa: E402


def print_profile(after: list, before: list, what: str) -> None:
    """Each phase's share of the cycles rank 0's task groups spent in the timed calls."""
    if not after or len(before) != len(after):
        print(f"# profile {what}: none (QCOMM_IPC_PROFILE was not on at set-up)")
        return
    delta = {name: v - b for (name, v), b in zip(after, before)}
    runs = delta.pop("runs")
    total = sum(delta.values()) or 1
    shares = ", ".join(f"{name} {100 * v / total:.0f}%" for name, v in delta.items())
    per = total / max(runs, 1)
    print(f"# profile {what}, rank 0: {per:.0f} cycles per task group and piece; {shares}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--sizes-mib", default="16,64,256")
    ap.add_argument("--bits", default="8/8,4/4")
    # float32 by default: the cost model reads these rows as fp32 messages
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--csv", default=None)
    ap.add_argument(
        "--profile", action="store_true", help="per-phase time of the fused kernel's blocks"
    )
    ap.add_argument(
        "--kernels",
        default="separate",
        choices=["separate", "fused"],
        help="fused: the experiment, in a QCOMM_EXPERIMENTS=1 build only",
    )
    ap.add_argument(
        "--blocks",
        type=int,
        default=None,
        help="blocks per rank (QCOMM_IPC_BLOCKS; default SMs / W - 1: see below)",
    )
    args = ap.parse_args()
    if args.profile and args.kernels != "fused":
        print("--profile counts the fused kernel's phases: add --kernels fused", file=sys.stderr)
        return 2
    if args.kernels == "fused" and not qcomm._C.compiled_with_experiments():
        print(
            "--kernels fused needs a build with the experiments (QCOMM_EXPERIMENTS=1 python "
            "setup.py build_ext --inplace; csrc/experiments/README.md): this build of qcomm has "
            "only the separate kernels",
            file=sys.stderr,
        )
        return 2
    os.environ["QCOMM_IPC_KERNELS"] = args.kernels  # read at the groups' set-up
    if not (torch.cuda.is_available() and qcomm.compiled_with_cuda()):
        print("needs a CUDA device and the CUDA build of qcomm", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    world = args.world
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # W kernels share one chip: each rank gets a little under 1/W of the SMs, so that the fused
    # kernels' blocks (one per SM at their register count) are all resident at once. With
    # exactly SMs / W each, the 4-rank fused run timed out on the H200 in both calls that tried
    # it (2026-11-30, eighth session: a rank waited for a peer's tiles the whole 5 s bound), while
    # SMs / W - 1 (32) ran; the 2-rank run ran with either (66 or 65).
    blocks = args.blocks if args.blocks is not None else max(1, sms // world - 1)
    if not 1 <= blocks <= sms:
        print(f"--blocks must be 1..{sms}", file=sys.stderr)
        return 2
    os.environ["QCOMM_IPC_BLOCKS"] = str(blocks)
    os.environ["QCOMM_CUDA_QUANTIZE"] = "1"  # the quantized CUDA path is opt-in
    if args.profile:
        os.environ["QCOMM_IPC_PROFILE"] = "1"  # read at the groups' set-up
    store = dist.HashStore()
    timeout = datetime.timedelta(seconds=60)
    backends = [None] * world

    def on_all(fn):
        errors = []

        def run(r):
            try:
                torch.cuda.set_device(0)
                fn(r)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(f"rank {r}: {e}")

        ts = [threading.Thread(target=run, args=(r,)) for r in range(world)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errors:
            raise RuntimeError("; ".join(errors))

    def make(r):
        gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), r, world, timeout)
        backends[r] = qcomm._C.QncclBackend(
            r,
            world,
            timeout,
            gloo,
            None,
            qcomm.QuantConfig(algorithm="two_step", min_bytes=0).encoded(),
            dist.PrefixStore("qcomm", store),
        )

    on_all(make)
    streams = [torch.cuda.Stream() for _ in range(world)]
    # Load the kernels the threads launch between allreduces now, while nothing runs: under lazy
    # loading (CUDA's default) a kernel loads at its first launch and the load waits for the
    # context's running kernels, here the peers' two_step kernels, which wait for this thread.
    # (qcomm loads its own kernels at set-up.)
    torch.cuda._sleep(1)
    torch.cuda.synchronize()
    # each row written as it is measured, so a failure at a later size keeps the earlier ones
    head = ["MiB", "kernel", "bits", "scale", "time_us", "GB/s (read+write)", "x copy"]
    out = qbench.CsvLog(args.csv, head, dicts=False)
    shape = ""
    if args.kernels == "fused":
        shape = (
            f", tiles of {os.environ.get('QCOMM_IPC_TILE_ELEMS', '4096')} elements "
            f"(QCOMM_IPC_TILE_ELEMS), task groups of "
            f"{os.environ.get('QCOMM_IPC_TASK_WARPS', '8')} warps (QCOMM_IPC_TASK_WARPS)"
        )
    print(
        f"# {torch.cuda.get_device_name()}, {world} ranks as threads on one GPU, {args.dtype}, "
        f"{args.kernels} kernels (QCOMM_IPC_KERNELS), "
        f"{blocks} blocks per rank, buffers of "
        f"{os.environ.get('QCOMM_IPC_BUFFER_MB', '32')} MiB (QCOMM_IPC_BUFFER_MB)" + shape
    )
    cols = ["MiB/rank", "bits", "time_us", "us per MiB of one rank", "copy_us (W msgs)", "x copy"]
    print(qbench.md_head(cols))
    for mib in (int(s) for s in args.sizes_mib.split(",")):
        numel = mib * 2**20 // torch.tensor([], dtype=dtype).element_size()
        xs = [torch.randn(numel, device="cuda").to(dtype) for _ in range(world)]
        # copy reference: W messages read and written once
        src = torch.cat(xs)
        dst = torch.empty_like(src)
        dst.copy_(src)
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(args.iters):
            dst.copy_(src)
        e1.record()
        torch.cuda.synchronize()
        copy_us = e0.elapsed_time(e1) / args.iters * 1e3
        for bits in args.bits.split(","):
            rs, ag = (int(b) for b in bits.split("/"))
            cfg = qcomm.QuantConfig(
                algorithm="two_step", rs_bits=rs, ag_bits=ag, min_bytes=0
            ).encoded()
            times = [0.0] * world
            before: list[int] = []

            def run(r, cfg=cfg, times=times, xs=xs, before=before):
                backends[r].set_config(cfg)
                with torch.cuda.stream(streams[r]):
                    o = dist.AllreduceOptions()
                    o.asyncOp = False
                    backends[r].allreduce([xs[r]], o).wait()  # warm-up (and set-up)
                    streams[r].synchronize()
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    if r == 0:
                        before[:] = [v for _, v in backends[0].cuda_ipc_profile()]
                    torch.cuda._sleep(200_000_000)  # keep the GPU busy while the host enqueues
                    start.record()
                    for _ in range(args.iters):
                        backends[r].allreduce([xs[r]], o).wait()
                    end.record()
                    end.synchronize()
                    times[r] = start.elapsed_time(end) / args.iters * 1e3

            on_all(run)
            t = max(times)  # the slowest rank's
            per_mib = t / (world * mib)
            # the cost model's row: one rank's share of the chip's time (t / W), asym (default)
            out.add(
                [
                    mib,
                    f"{args.kernels}_two_step",
                    bits,
                    "asym",
                    f"{t / world:.1f}",
                    f"{world * mib * 2**20 / (t * 1e-6) / 1e9:.1f}",
                    f"{copy_us / t:.2f}",
                ]
            )
            cells = [mib, bits, f"{t:.1f}", f"{per_mib:.2f}", f"{copy_us:.1f}"]
            print(qbench.md_row(cells + [f"{copy_us / t:.2f}"]), flush=True)
            if args.profile:
                print_profile(backends[0].cuda_ipc_profile(), before, f"{mib} MiB {bits}")
            if any(torch.isnan(x.float()).any() for x in xs):
                print("non-finite values appeared", file=sys.stderr)
                return 1
            for x in xs:  # keep magnitudes bounded across repeated in-place sums
                x.div_(world ** (args.iters + 1))
        del xs, src, dst
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
