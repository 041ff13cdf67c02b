"""Megatron-core tensor parallelism with quantized TP allreduces: a torchrun example.

qnccl is the default process group with algorithm="none" (everything exact), Megatron creates its
groups on it, and ``qcomm.megatron.quantize_tensor_parallel`` switches only the tensor-parallel
group to a quantized config. A ColumnParallelLinear -> GELU -> RowParallelLinear MLP runs forward
and backward once exact and once per quantized config (same weights, same input); each rank 0 line
is the relative L2 error of the output and of the input gradient against the exact run, and the
TP group's counters.

With ``--sequence-parallel`` Megatron runs the TP group's traffic as reduce-scatters and
all-gathers along the sequence (``sequence_parallel=True``, the usual training setting): each rank
holds its part of the sequence, and ``quantize_tensor_parallel(cfg, reduce_scatter=True,
all_gather=...)`` quantizes them (``--sp-all-gather`` also quantizes the all-gathers, which changes
what the forward computes with).

GPUs (NCCL under qnccl; CUDA tensors are quantized once the CUDA path of issue 3 is built, until
then they pass through exactly and the errors print as 0)::

    torchrun --nproc_per_node 4 examples/megatron_tp.py

CPU (Gloo under qnccl)::

    torchrun --nproc_per_node 2 examples/megatron_tp.py --cpu
    torchrun --nproc_per_node 2 examples/megatron_tp.py --cpu --sequence-parallel --sp-all-gather
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import qcomm  # noqa: E402  (registers "qnccl")
import qcomm.megatron  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="CPU tensors (Gloo under qnccl)")
    p.add_argument("--tp", type=int, default=0, help="tensor-parallel size (default: world size)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--ffn", type=int, default=4096)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--dtype", choices=DTYPES, default="fp32")
    p.add_argument("--algorithms", default="two_step,ring,semi_ring")
    p.add_argument("--bits", default="8/8,4/8,4/4", help="rs/ag pairs, comma separated")
    p.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="sequence_parallel=True: the TP traffic is reduce-scatters (at rs bits) and "
        "all-gathers, the sequence split over the TP ranks",
    )
    p.add_argument(
        "--sp-all-gather",
        action="store_true",
        help="with --sequence-parallel: quantize the all-gathers too (at ag bits)",
    )
    return p.parse_args()


def build_mlp(args, tp_size, device):
    from megatron.core import tensor_parallel
    from megatron.core.model_parallel_config import ModelParallelConfig

    on_cpu = device.type == "cpu"
    cfg = ModelParallelConfig(
        tensor_model_parallel_size=tp_size,
        params_dtype=DTYPES[args.dtype],
        use_cpu_initialization=on_cpu,  # the GPU init path needs the CUDA RNG tracker
        perform_initialization=True,
        gradient_accumulation_fusion=False,
        sequence_parallel=args.sequence_parallel,
    )
    torch.manual_seed(1234)
    if not on_cpu:
        tensor_parallel.model_parallel_cuda_manual_seed(1234)

    def init(w):
        return torch.nn.init.normal_(w, std=0.02)

    col = tensor_parallel.ColumnParallelLinear(
        args.hidden, args.ffn, config=cfg, init_method=init, bias=True, gather_output=False
    )
    row = tensor_parallel.RowParallelLinear(
        args.ffn, args.hidden, config=cfg, init_method=init, bias=True, input_is_parallel=True,
        skip_bias_add=False,
    )  # fmt: skip
    return col, row


def run(col, row, x, g):
    for p in list(col.parameters()) + list(row.parameters()):
        p.grad = None
    x = x.clone().requires_grad_(True)
    h, _ = col(x)
    y, _ = row(torch.nn.functional.gelu(h))
    y.backward(g)
    return y.detach().float(), x.grad.float()


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def main():
    args = parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.cpu:
        device = torch.device("cpu")
        if args.sequence_parallel:
            # Megatron's sequence-parallel gathers allocate their buffers on
            # torch.cuda.current_device(); on CPU ranks that device is the CPU
            torch.cuda.current_device = lambda: "cpu"
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["WORLD_SIZE"])))
    else:
        if not torch.cuda.is_available():
            sys.exit("no CUDA device: run with --cpu")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    # every group starts exact; only the TP group will quantize
    dist.init_process_group("qnccl", pg_options=qcomm.QuantConfig(algorithm="none"))
    rank, world = dist.get_rank(), dist.get_world_size()

    from megatron.core import parallel_state

    tp_size = args.tp or world
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp_size)
    tp = parallel_state.get_tensor_model_parallel_group()
    qcomm.megatron.quantize_tensor_parallel(qcomm.megatron.EXACT)

    col, row = build_mlp(args, tp_size, device)
    col.to(device)
    row.to(device)
    gen = torch.Generator().manual_seed(7)  # identical input on every rank of a TP group
    dtype = DTYPES[args.dtype]
    x = torch.randn(args.seq, args.batch, args.hidden, generator=gen).to(device, dtype)
    g = torch.randn(args.seq, args.batch, args.hidden, generator=gen).to(device, dtype)
    if args.sequence_parallel:  # this rank's part of the sequence
        if args.seq % tp_size:
            sys.exit(f"--seq {args.seq} is not a multiple of the TP size {tp_size}")
        part = args.seq // tp_size
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        x = x[tp_rank * part : (tp_rank + 1) * part].contiguous()
        g = g[tp_rank * part : (tp_rank + 1) * part].contiguous()

    t0 = time.perf_counter()
    y_e, dx_e = run(col, row, x, g)
    t_exact = time.perf_counter() - t0
    if rank == 0:
        payload_mib = (
            y_e.numel() * tp_size**args.sequence_parallel * torch.finfo(dtype).bits / 8 / 2**20
        )
        print(
            f"world {world}, TP {tp_size}, {device.type}, {args.dtype}, MLP {args.hidden}->"
            f"{args.ffn}->{args.hidden}, tokens {args.seq}x{args.batch}; TP "
            f"{'reduce-scatter/all-gather' if args.sequence_parallel else 'allreduce'} "
            f"{payload_mib:.2f} MiB; exact run "
            f"{t_exact * 1e3:.0f} ms"
        )
        print(f"{'algorithm':10s} {'rs/ag':6s} {'out rel L2':>11s} {'dgrad rel L2':>13s} "
              f"{'quantized':>9s} {'compression':>11s} {'ms':>7s}")  # fmt: skip
    for algo in args.algorithms.split(","):
        for bits in args.bits.split(","):
            rs, ag = (None if b == "none" else int(b) for b in bits.split("/"))
            cfg = qcomm.QuantConfig(algorithm=algo, rs_bits=rs, ag_bits=ag, min_bytes=0)
            if args.sequence_parallel:
                qcomm.megatron.quantize_tensor_parallel(
                    cfg, reduce_scatter=True, all_gather=args.sp_all_gather
                )
            else:
                qcomm.megatron.quantize_tensor_parallel(cfg)
            qcomm.reset_stats(tp)
            t0 = time.perf_counter()
            y_q, dx_q = run(col, row, x, g)
            ms = (time.perf_counter() - t0) * 1e3
            st = qcomm.stats(tp)
            if rank == 0:
                comp = f"{st['compression']:.2f}x" if st["compression"] else "-"
                print(
                    f"{algo:10s} {bits:6s} {rel(y_q, y_e):11.2e} {rel(dx_q, dx_e):13.2e} "
                    f"{st['quantized_calls']:9d} {comp:>11s} {ms:7.0f}"
                )
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
