"""PyTorch-native tensor parallelism on qnccl: a transformer block (attention and MLP) split with
`parallelize_module`, as torchtitan splits its layers. With sequence parallelism (the default)
the norms run on each rank's part of the sequence (`SequenceParallel`), each sublayer all-gathers
its input (`PrepareModuleInput`, Shard(1) -> Replicate) and reduce-scatters its output
(`RowwiseParallel(output_layouts=Shard(1))`); without it (--no-sp) every rank holds the whole
sequence and the row-parallel outputs are allreduced. DTensor reaches the backend through the
functional collectives' coalesced forms, which qnccl quantizes when the group opts in
(`QuantConfig(reduce_scatter=True, all_gather=True)`; allreduces quantize by default).

Each rank runs --steps forward and backward passes and prints how many calls of each collective
were quantized and the relative L2 error of its output against the same block run unsharded.

    torchrun --nproc_per_node 2 examples/native_tp.py            # CPU: qnccl over Gloo
    torchrun --nproc_per_node 2 examples/native_tp.py --no-sp --exact

tests/integration/test_native_tp.py runs the block on 2 ranks against its error bound;
benchmarks/tp_block_slow_link.py times it over a slow link.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    """Causal multi-head self-attention. Under tensor parallelism each rank holds heads / W heads
    (wq, wk, wv split by output column), so the head count comes from the local width."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape

        def heads(t):
            return t.view(b, s, -1, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.wq(x)), heads(self.wk(x)), heads(self.wv(x))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    """A pre-norm transformer block: x + attention(norm(x)), then h + feed_forward(norm(h))."""

    def __init__(self, dim: int = 64, heads: int = 4, hidden: int | None = None):
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = Attention(dim, heads)
        self.ffn_norm = nn.LayerNorm(dim)
        self.feed_forward = FeedForward(dim, hidden or 4 * dim)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


def tp_plan(sequence_parallel: bool = True) -> dict:
    """The `parallelize_module` plan of a Block (torchtitan's layout). With sequence parallelism
    the block's input and output are each rank's part of the sequence (dimension 1)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    plan = {f"attention.{w}": ColwiseParallel() for w in ("wq", "wk", "wv")} | {
        "feed_forward.w1": ColwiseParallel()
    }
    if not sequence_parallel:
        return plan | {"attention.wo": RowwiseParallel(), "feed_forward.w2": RowwiseParallel()}
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return plan | {
        "attention_norm": SequenceParallel(),
        "attention": gather,
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": gather,
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }


def parallel_block(block: Block, mesh, sequence_parallel: bool = True) -> Block:
    from torch.distributed.tensor.parallel import parallelize_module

    return parallelize_module(block, mesh, tp_plan(sequence_parallel))


def local_input(x, rank: int, world: int, sequence_parallel: bool = True):
    """What one rank feeds the parallel block: its part of the sequence, or all of it."""
    return x.chunk(world, dim=1)[rank] if sequence_parallel else x


def main() -> int:
    import copy
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import qcomm

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-sp", dest="sp", action="store_false", help="no sequence parallelism")
    ap.add_argument("--exact", action="store_true", help="the group passes everything through")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    cfg = qcomm.QuantConfig(
        algorithm="none" if args.exact else "auto", reduce_scatter=True, all_gather=True
    )
    dist.init_process_group("qnccl", pg_options=cfg)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = "cuda" if torch.cuda.is_available() and os.environ.get("LOCAL_RANK") else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(0)
    exact = Block(args.dim, args.heads).to(device)
    block = parallel_block(copy.deepcopy(exact), init_device_mesh(device, (world,)), args.sp)
    gen = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        x = torch.randn(args.batch, args.seq, args.dim, generator=gen).to(device)
        want = exact(x)
        out = block(local_input(x, rank, world, args.sp))
        out.square().sum().backward()
        ref = local_input(want, rank, world, args.sp).detach()
        err = float((out.detach() - ref).norm() / ref.norm())
        by = qcomm.stats()["by_collective"]
        quantized = ", ".join(f"{k} {v['quantized_calls']}" for k, v in sorted(by.items()))
        print(f"[rank {rank}] step {step}: output rel L2 {err:.2e}; quantized calls: {quantized}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
