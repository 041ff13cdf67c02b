"""Issue 48: PyTorch-native tensor parallelism on qnccl, which reaches the backend through the
functional collectives' coalesced forms. An MLP block with sequence parallelism
(`parallelize_module`: `SequenceParallel` on the norm, `ColwiseParallel(input_layouts=Shard(1))`,
`RowwiseParallel(output_layouts=Shard(1))`) runs forward and backward on 2 ranks: its all-gathers
and reduce-scatters are quantized when the group opts in, and its output and gradients stay
within the codec's error of the same block run unsharded. And a torch.compile'd function of
funcol's all-gather and reduce-scatter compiles, quantizes and matches eager within the bound."""

import torch
import torch.distributed as dist
import torch.nn as nn

import qcomm

from dist_util import run_ranks

CFG = qcomm.QuantConfig(min_bytes=0, reduce_scatter=True, all_gather=True, tune=False)
D, S, B = 64, 32, 4  # width, sequence, batch
# The 8-bit codec (groups of 128): each element of a quantized message errs by at most half a
# step, max|group| / 255, about 1.6% of a Gaussian group's RMS at its ~4-sigma maximum; in L2 over
# a message, under 1%. The output goes through two quantized collectives (the input's all-gather,
# the output's reduce-scatter): 2% relative L2 (measured 0.17%). A parameter's gradient is a sum
# over the batch of products of two quantized operands (forward all-gather, backward all-gather
# of the output's gradient) whose signed terms partly cancel, which raises the relative error:
# 10% (measured at most 4.2%, up.weight). A wrong shard order or a dropped rank's contribution
# (errors of order 100%) fails either.
REL_L2 = 0.02
REL_L2_GRAD = 0.10


class MLPBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.up = nn.Linear(D, 4 * D)
        self.down = nn.Linear(4 * D, D)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


def _rel(got, exact):
    return float((got.double() - exact.double()).norm() / exact.double().norm())


def _counts():
    by = qcomm.stats()["by_collective"]
    return {k: by[k]["quantized_calls"] for k in ("all_reduce", "reduce_scatter", "all_gather")}


def _tp_worker(rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    exact_model = MLPBlock()
    model = MLPBlock()
    model.load_state_dict(exact_model.state_dict())
    mesh = init_device_mesh("cpu", (world,))
    parallelize_module(
        model,
        mesh,
        {
            "norm": SequenceParallel(),
            "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1)),
        },
    )
    x = torch.randn(B, S, D, generator=torch.Generator().manual_seed(1))
    exact = exact_model(x)
    exact.square().sum().backward()
    before = _counts()
    local = x.chunk(world, dim=1)[rank]  # this rank's part of the sequence
    out = model(local)
    out.square().sum().backward()
    counts = {k: v - before[k] for k, v in _counts().items()}
    errors = {"output": _rel(out, exact.chunk(world, dim=1)[rank])}
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        errors[name] = _rel(g, dict(exact_model.named_parameters())[name].grad)
    return errors, counts


def test_sequence_parallel_mlp_block_quantizes_within_the_bound():
    for rank, (errors, counts) in enumerate(run_ranks(_tp_worker, 2, pg_options=CFG)):
        bad = {
            k: e for k, e in errors.items() if not e <= (REL_L2 if k == "output" else REL_L2_GRAD)
        }
        assert not bad, (rank, bad)
        # forward: the input's all-gather, the output's reduce-scatter; backward: the reverse
        assert counts["all_gather"] >= 2 and counts["reduce_scatter"] >= 2, (rank, counts)


def _compile_worker(rank, world):
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD

    def f(x):
        full = funcol.all_gather_tensor(x, 0, group)
        return funcol.reduce_scatter_tensor(full * 2.0, "sum", 0, group)

    x = torch.randn(4096, generator=torch.Generator().manual_seed(rank))
    eager = f(x)
    before = _counts()
    compiled = torch.compile(f, fullgraph=True)(x)
    counts = {k: v - before[k] for k, v in _counts().items()}
    xs = [torch.randn(4096, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    exact = (torch.cat(xs).double() * 2.0 * world).chunk(world)[rank]
    return _rel(eager, exact), _rel(compiled, exact), counts


def test_compiled_functional_collectives_quantize():
    for rank, (eager, compiled, counts) in enumerate(run_ranks(_compile_worker, 2, pg_options=CFG)):
        assert eager <= REL_L2 and compiled <= REL_L2, (rank, eager, compiled)
        assert counts["all_gather"] >= 1 and counts["reduce_scatter"] >= 1, (rank, counts)
