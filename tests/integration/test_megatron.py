"""Megatron-core tensor parallelism over qnccl on the CPU (megatron-core from PyPI).

A ColumnParallelLinear (gather_output=False) -> GELU -> RowParallelLinear (input_is_parallel=True)
block runs forward and backward on TP ranks, once with the TP group exact (algorithm="none") and
once quantized (qcomm.set_config on the live group between the runs). The block has exactly two TP
allreduces: the RowParallel output (forward) and the ColumnParallel input gradient (backward).
Their inputs, the per-rank partial sums, are identical in both runs (the ColumnParallel forward has
no communication and the upstream gradient is fixed), so the only difference between the runs is
the allreduce itself, and the tolerance is the codec's error bound computed from those partials
with ``qcomm.reference.allreduce(...).bound`` (not a fitted number). The partials are captured by
wrapping ``torch.distributed.all_reduce``, which Megatron looks up at call time.

A second run (world 4, TP=2 x DP=2) checks ``qcomm.megatron.quantize_tensor_parallel``: the TP
allreduces are quantized, the data-parallel and default groups stay exact, bit for bit.
"""

from __future__ import annotations

import pytest

pytest.importorskip(
    "megatron.core",
    reason="megatron-core cannot be imported (pip install megatron-core)",
    exc_type=ImportError,
)

import qcomm  # noqa: E402

from dist_util import run_ranks  # noqa: E402

HIDDEN, FFN, SEQ, BATCH = 96, 384, 16, 2
CONFIGS = [
    qcomm.QuantConfig(algorithm="two_step", rs_bits=8, ag_bits=8, min_bytes=0),
    qcomm.QuantConfig(algorithm="two_step", rs_bits=4, ag_bits=8, min_bytes=0),
    qcomm.QuantConfig(algorithm="ring", rs_bits=8, ag_bits=8, min_bytes=0, symmetric=True),
    qcomm.QuantConfig(algorithm="semi_ring", rs_bits=4, ag_bits=4, min_bytes=0),
]
EXACT = qcomm.QuantConfig(algorithm="none")


def _block(tp_size):
    """The Megatron MLP block, built identically on every run (CPU init, fixed seed)."""
    import torch
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    cfg = ModelParallelConfig(
        tensor_model_parallel_size=tp_size,
        use_cpu_initialization=True,
        perform_initialization=True,
        gradient_accumulation_fusion=False,
        sequence_parallel=False,
    )
    torch.manual_seed(1234)  # the master weights are drawn whole on every rank, then split

    def init(w):
        return torch.nn.init.normal_(w, std=0.05)

    col = ColumnParallelLinear(
        HIDDEN, FFN, config=cfg, init_method=init, bias=True, gather_output=False
    )
    row = RowParallelLinear(
        FFN, HIDDEN, config=cfg, init_method=init, bias=True, input_is_parallel=True,
        skip_bias_add=False,
    )  # fmt: skip
    return col, row


class _Recorder:
    """Wraps torch.distributed.all_reduce: keeps a copy of every input and the tensor itself (its
    contents after the call, or after wait() when async, are the result)."""

    def __init__(self):
        import torch.distributed as dist

        self.dist, self.real, self.calls = dist, dist.all_reduce, []

    def __enter__(self):
        def wrapper(tensor, *args, **kwargs):
            self.calls.append((tensor.detach().clone(), tensor))
            return self.real(tensor, *args, **kwargs)

        self.dist.all_reduce = wrapper
        return self

    def __exit__(self, *exc):
        self.dist.all_reduce = self.real


def _run_block(col, row, tp_size):
    """Forward + backward with fixed input and upstream gradient; returns output, input gradient
    and the (input, result) of each TP allreduce in call order."""
    import torch

    gen = torch.Generator().manual_seed(99)  # same on every rank: the block's input is replicated
    x = torch.randn(SEQ, BATCH, HIDDEN, generator=gen).requires_grad_(True)
    g = torch.randn(SEQ, BATCH, HIDDEN, generator=gen)
    for p in list(col.parameters()) + list(row.parameters()):
        p.grad = None
    with _Recorder() as rec:
        h, _ = col(x)
        y, _ = row(torch.nn.functional.gelu(h))
        y.backward(g)
    calls = [(inp, res.detach().clone()) for inp, res in rec.calls]
    return y.detach().clone(), x.grad.clone(), calls


def _tp2_body(rank, world):
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    import qcomm
    import qcomm.megatron
    from qcomm import reference

    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    tp = ps.get_tensor_model_parallel_group()
    qcomm.megatron.quantize_tensor_parallel(EXACT)
    col, row = _block(world)
    y_e, dx_e, calls_e = _run_block(col, row, world)
    assert len(calls_e) == 2, (
        "expected two TP allreduces: RowParallel forward, ColumnParallel dgrad"
    )
    report = []
    for cfg in CONFIGS:
        qcomm.set_config(cfg, group=tp)  # switch the live group between runs
        qcomm.reset_stats(tp)
        y_q, dx_q, calls_q = _run_block(col, row, world)
        st = qcomm.stats(tp)
        assert st["quantized_calls"] == 2 and st["passthrough_calls"] == 0, st
        for (inp_e, _), (inp_q, _) in zip(calls_e, calls_q):
            assert torch.equal(inp_e, inp_q), "the allreduce inputs differ between the runs"
        for name, (inp, res), exact_val, quant_val in (
            ("forward output", calls_q[0], y_e, y_q),
            ("input gradient", calls_q[1], dx_e, dx_q),
        ):
            parts = [torch.empty_like(inp) for _ in range(world)]
            dist.all_gather(parts, inp, group=tp)  # passes through: exact
            ref = reference.allreduce(
                [p.flatten() for p in parts], cfg.algorithm, cfg.rs_bits, cfg.ag_bits,
                cfg.group_size, cfg.symmetric,
            )  # fmt: skip
            # the extension matches its reference model bit for bit
            assert torch.equal(res.flatten(), ref.out), f"{cfg} {name}: differs from reference"
            # the quantized run is within the codec's bound of the exact run; the exact run itself
            # is the fp32 sum (at most 2^-24 relative from the float64 sum) plus the zero bias
            bound = ref.bound.view_as(exact_val) + exact_val.abs().double() * 2.0**-23
            err = (quant_val.double() - exact_val.double()).abs()
            assert bool((err <= bound).all()), (
                f"{cfg} {name}: max error {err.max():.3g} exceeds the bound at "
                f"{int((err > bound).sum())} elements"
            )
            assert err.max() > 0, f"{cfg} {name}: no quantization error at all?"
            rel = float(err.norm() / exact_val.double().norm())
            report.append((cfg.algorithm, cfg.rs_bits, cfg.ag_bits, name, rel))
    ps.destroy_model_parallel()
    return report


def test_column_row_parallel_quantized_within_codec_bound():
    reports = run_ranks(_tp2_body, 2, pg_options=EXACT, timeout=120)
    assert reports[0] == reports[1]
    for algo, rs, ag, name, rel in reports[0]:
        print(f"{algo:9s} rs={rs} ag={ag} {name:14s} relative L2 error {rel:.2e}")
        # sanity on the bound's scale: 8-bit runs are far from the signal's size
        assert rel < (0.02 if (rs, ag) == (8, 8) else 0.2)


def _tp_dp_body(rank, world):
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    import qcomm
    import qcomm.megatron

    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    tp = ps.get_tensor_model_parallel_group()
    dp = ps.get_data_parallel_group()
    # Megatron creates its groups without pg_options: they start from the env/defaults (which
    # quantize from 1 MiB), hence quantize_tensor_parallel also sets the others to exact
    assert qcomm.get_config(dp) == qcomm.from_env()
    cfg = qcomm.QuantConfig(algorithm="two_step", rs_bits=4, ag_bits=8, min_bytes=0, tune=False)
    counts = qcomm.megatron.quantize_tensor_parallel(cfg)
    assert counts["quantized"] == 1 and counts["exact"] >= 2, counts
    assert qcomm.get_config(tp) == cfg
    assert qcomm.get_config(dp) == qcomm.megatron.EXACT
    assert qcomm.get_config() == qcomm.megatron.EXACT
    for g in (tp, dp, None):
        qcomm.reset_stats(g)

    col, row = _block(2)
    _run_block(col, row, 2)
    st_tp = qcomm.stats(tp)
    assert st_tp["quantized_calls"] == 2 and st_tp["passthrough_calls"] == 0, st_tp

    # data parallel: 2 MiB of fp32 (the default config would quantize it); a + b in fp32 is the
    # same whatever the order, so the exact result is known bit for bit
    n = 1 << 19
    dp_ranks = dist.get_process_group_ranks(dp)
    mine = [torch.randn(n, generator=torch.Generator().manual_seed(r)) for r in dp_ranks]
    x = mine[dp_ranks.index(rank)].clone()
    dist.all_reduce(x, group=dp)
    assert torch.equal(x, mine[0] + mine[1]), "data-parallel allreduce is not exact"
    st_dp = qcomm.stats(dp)
    assert st_dp["quantized_calls"] == 0 and st_dp["passthrough_calls"] == 1, st_dp

    # the default group (world): integer-valued floats, exact in any summation order
    ints = [torch.randint(-1000, 1000, (n,), generator=torch.Generator().manual_seed(10 + r))
            for r in range(world)]  # fmt: skip
    w = ints[rank].float()
    dist.all_reduce(w)
    assert torch.equal(w, sum(ints).float()), "default-group allreduce is not exact"
    st_w = qcomm.stats()
    assert st_w["quantized_calls"] == 0 and st_w["passthrough_calls"] == 1, st_w

    # quantize_groups_by_desc touches only the named groups
    ept = qcomm.QuantConfig(algorithm="ring", min_bytes=0)
    assert qcomm.megatron.quantize_groups_by_desc(ept, ["EXPERT_TENSOR_PARALLEL_GROUP"]) == [
        "EXPERT_TENSOR_PARALLEL_GROUP"
    ]
    assert qcomm.get_config(ps.get_expert_tensor_parallel_group()) == ept
    assert qcomm.get_config(tp) == cfg and qcomm.get_config(dp) == qcomm.megatron.EXACT

    # a TP group of another backend is refused with a clear message
    # (new_group is collective over the world: every rank creates both, keeps its own)
    gloo_groups = [dist.new_group(r, backend="gloo") for r in ([0, 1], [2, 3])]
    gloo_tp = gloo_groups[rank // 2]
    saved, ps._TENSOR_MODEL_PARALLEL_GROUP = ps._TENSOR_MODEL_PARALLEL_GROUP, gloo_tp
    try:
        qcomm.megatron.quantize_tensor_parallel(cfg)
        raise AssertionError("a gloo TP group was accepted")
    except ValueError as e:
        assert "not 'qnccl'" in str(e), e
    ps._TENSOR_MODEL_PARALLEL_GROUP = saved
    ps.destroy_model_parallel()
    try:
        qcomm.megatron.quantize_tensor_parallel(cfg)
        raise AssertionError("accepted before initialize_model_parallel")
    except RuntimeError as e:
        assert "initialize_model_parallel" in str(e), e
    return st_tp


def test_tp_quantized_dp_and_default_exact():
    stats = run_ranks(_tp_dp_body, 4, pg_options=EXACT, timeout=150)
    assert all(s["quantized_calls"] == 2 for s in stats)


def _sp_body(rank, world):
    # Megatron-core's sequence-parallel mappings allocate their buffers on
    # torch.cuda.current_device(); on this CPU-only test that device is the CPU
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    import qcomm
    import qcomm.megatron

    torch.cuda.current_device = lambda: "cpu"
    ps.initialize_model_parallel(tensor_model_parallel_size=2)
    tp = ps.get_tensor_model_parallel_group()
    mp = ModelParallelConfig(
        tensor_model_parallel_size=2,
        use_cpu_initialization=True,
        gradient_accumulation_fusion=False,
        sequence_parallel=True,
    )

    def init(w):
        return torch.nn.init.normal_(w, std=0.05)

    torch.manual_seed(1234)
    col = ColumnParallelLinear(HIDDEN, FFN, config=mp, init_method=init, bias=True,
                               gather_output=False)  # fmt: skip
    row = RowParallelLinear(FFN, HIDDEN, config=mp, init_method=init, bias=True,
                            input_is_parallel=True, skip_bias_add=False)  # fmt: skip
    gen = torch.Generator().manual_seed(99)
    xs = torch.randn(SEQ, BATCH, HIDDEN, generator=gen)
    gs = torch.randn(SEQ, BATCH, HIDDEN, generator=gen)
    half = SEQ // 2  # this rank's part of the sequence

    def run():
        x = xs[rank * half : (rank + 1) * half].clone().requires_grad_(True)
        for p in list(col.parameters()) + list(row.parameters()):
            p.grad = None
        h, _ = col(x)
        y, _ = row(torch.nn.functional.gelu(h))
        y.backward(gs[rank * half : (rank + 1) * half])
        return y.detach(), x.grad.clone()

    y0, g0 = run()  # exact: the TP group passes through
    cfg = qcomm.QuantConfig(min_bytes=0, tune=False, rotate=False)
    qcomm.megatron.quantize_tensor_parallel(cfg, reduce_scatter=True, all_gather=True)
    qcomm.reset_stats(tp)
    y1, g1 = run()
    by = qcomm.stats(tp)["by_collective"]
    rel_y = float((y1 - y0).norm() / y0.norm())
    rel_g = float((g1 - g0).norm() / g0.norm())
    dist.barrier()
    ps.destroy_model_parallel()
    return by, rel_y, rel_g


def test_sequence_parallel_reduce_scatter_and_all_gather_quantized():
    for by, rel_y, rel_g in run_ranks(_sp_body, 2, pg_options=EXACT, timeout=150):
        # forward: the input all-gathered, the output reduce-scattered; backward: the input's
        # gradient reduce-scattered, the activation all-gathered again for the weight gradient
        assert by["reduce_scatter"]["quantized_calls"] >= 2, by
        assert by["all_gather"]["quantized_calls"] >= 1, by
        assert by["all_reduce"]["quantized_calls"] == 0, by
        print(f"sequence parallel, 8 bits: relative L2 error out {rel_y:.2e}, grad {rel_g:.2e}")
        assert 0 < rel_y < 0.02 and 0 < rel_g < 0.02, (rel_y, rel_g)
