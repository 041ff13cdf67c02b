"""Issue 48: PyTorch-native tensor parallelism on qnccl, which reaches the backend through the
functional collectives' coalesced forms. A transformer block (attention and MLP, examples/
native_tp.py) under `parallelize_module` runs forward and backward on 2 ranks, with sequence
parallelism (`SequenceParallel` norms, `PrepareModuleInput` all-gathers, `ColwiseParallel`,
`RowwiseParallel(output_layouts=Shard(1))` reduce-scatters) and without (row-parallel outputs
allreduced): every all-gather, reduce-scatter and allreduce of the block is quantized when the
group opts in, and its output and gradients stay within the codec's error of the same block run
unsharded. And a torch.compile'd function of funcol's all-gather and reduce-scatter compiles,
quantizes and matches eager within the bound."""

import copy
import os
import sys

import pytest
import torch
import torch.distributed as dist

import qcomm

from dist_util import run_ranks

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import native_tp  # noqa: E402

CFG = qcomm.QuantConfig(min_bytes=0, reduce_scatter=True, all_gather=True, tune=False)
D, HEADS, S, B = 64, 4, 32, 4  # width, heads, sequence, batch
# The 8-bit codec (groups of 128): each element of a quantized message errs by at most half a
# step, max|group| / 255, about 1.6% of a Gaussian group's RMS at its ~4-sigma maximum; in L2 over
# a message, under 1%. The block's output passes through two sublayers, each behind a quantized
# input all-gather and a quantized output reduce-scatter (or allreduce): 2% relative L2 (measured
# at most 0.19%). A parameter's gradient is a sum over the batch of products of two quantized
# operands (forward all-gather, backward all-gather or allreduce of the output's gradient) whose
# signed terms partly cancel, which raises the relative error: 10% (measured at most 1.3%). A
# wrong shard order or a dropped rank's contribution (errors of order 100%) fails either.
REL_L2 = 0.02
REL_L2_GRAD = 0.10


def _rel(got, exact):
    got, exact = got.detach().double(), exact.detach().double()
    return float((got - exact).norm() / exact.norm())


def _counts():
    by = qcomm.stats()["by_collective"]
    return {
        f"{k}_{w}": by[k][f"{w}_calls"]
        for k in ("all_reduce", "reduce_scatter", "all_gather")
        for w in ("quantized", "passthrough")
    }


def _tp_worker(rank, world, sp):
    from torch.distributed.device_mesh import init_device_mesh

    torch.manual_seed(0)
    exact_model = native_tp.Block(D, HEADS)
    model = native_tp.parallel_block(
        copy.deepcopy(exact_model), init_device_mesh("cpu", (world,)), sp
    )
    x = torch.randn(B, S, D, generator=torch.Generator().manual_seed(1))
    exact = exact_model(x)
    exact.square().sum().backward()
    before = _counts()
    out = model(native_tp.local_input(x, rank, world, sp))
    out.square().sum().backward()
    counts = {k: v - before[k] for k, v in _counts().items()}
    errors = {"output": _rel(out, native_tp.local_input(exact, rank, world, sp))}
    for name, p in model.named_parameters():
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        errors[name] = _rel(g, dict(exact_model.named_parameters())[name].grad)
    return errors, counts


@pytest.mark.parametrize("sp", [True, False], ids=["sequence_parallel", "tensor_parallel"])
def test_transformer_block_quantizes_every_collective_within_the_bound(sp):
    for rank, (errors, counts) in enumerate(run_ranks(_tp_worker, 2, sp, pg_options=CFG)):
        bad = {
            k: e for k, e in errors.items() if not e <= (REL_L2 if k == "output" else REL_L2_GRAD)
        }
        assert not bad, (rank, bad)
        # nothing of the block passes through
        assert not any(v for k, v in counts.items() if k.endswith("passthrough")), (rank, counts)
        if sp:
            # forward: each sublayer's input all-gather and output reduce-scatter; backward: the
            # reverse (the norms' weight gradients stay Partial until full_tensor, after the count)
            assert counts["all_gather_quantized"] >= 4, (rank, counts)
            assert counts["reduce_scatter_quantized"] >= 4, (rank, counts)
        else:
            # forward: each row-parallel output; backward: each column-parallel input's gradient
            assert counts["all_reduce_quantized"] >= 4, (rank, counts)


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
        assert counts["all_gather_quantized"] >= 1, (rank, counts)
        assert counts["reduce_scatter_quantized"] >= 1, (rank, counts)
