"""The quantized allreduce, multi-process over Gloo: every rank gets the same bits, equal to the
reference algorithm's, within the analytic bound of the exact sum, and in place."""

import hashlib
import itertools

import pytest
import torch
import torch.distributed as dist

import qcomm
from qcomm import reference as ref

from dist_util import run_ranks

ALGOS = ["two_step", "ring", "semi_ring"]
BITS = [(8, 8), (4, 8), (4, 4), (None, 8), (8, None)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
NUMELS = [1, 7, 1000, 65539]


def _inputs(world, numel, dtype, seed, kind="normal"):
    xs = []
    for r in range(world):
        g = torch.Generator().manual_seed(seed * 1000 + r)
        x = torch.randn(numel, generator=g)
        if kind == "mixed":
            x = x * (10.0 ** (r - 1))  # magnitudes differ across ranks
        xs.append(x.to(dtype))
    return xs


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha1(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def _ranks_agree(x: torch.Tensor, world: int) -> bool:
    """Whether every rank holds x's bits (a collective: every rank calls it)."""
    digests = [None] * world
    dist.all_gather_object(digests, _digest(x))
    return len(set(digests)) == 1


def _assert_no_problems(worker, world: int, **kwargs) -> None:
    """Run worker(rank, world) on `world` ranks; fail with every problem any rank returned."""
    problems = run_ranks(worker, world, **kwargs)
    flat = sorted(set(p for ps in problems for p in ps))
    assert not flat, "\n".join(flat)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    na, nb = torch.isnan(a), torch.isnan(b)
    return torch.equal(na, nb) and torch.equal(a[~na], b[~nb])


def _check_case(rank, world, algo, rs, ag, dtype, numel, seed, average=False, kind="normal"):
    """Run one allreduce; return a list of problems (empty when all is well)."""
    cfg = qcomm.QuantConfig(algorithm=algo, rs_bits=rs, ag_bits=ag, min_bytes=0, microshards=3)
    qcomm.set_config(cfg)
    xs = _inputs(world, numel, dtype, seed, kind)
    x = xs[rank].clone()
    before = qcomm.stats()["quantized_calls"]
    op = dist.ReduceOp.AVG if average else dist.ReduceOp.SUM
    dist.all_reduce(x, op=op)
    name = f"{algo} rs={rs} ag={ag} {dtype} n={numel} avg={average} {kind}"
    problems = []
    if qcomm.stats()["quantized_calls"] != before + 1:
        problems.append(f"{name}: was not quantized")
    r = ref.allreduce(xs, algo, rs, ag, average=average)
    if not _same_bits(x, r.out):
        diff = (x.double() - r.out.double()).abs().max().item()
        problems.append(f"{name}: differs from the reference (max diff {diff})")
    err = (x.double() - r.exact).abs()
    if not bool((err <= r.bound).all()):
        problems.append(f"{name}: outside the bound (max err/bound {(err / r.bound).max().item()})")
    if not _ranks_agree(x, world):
        problems.append(f"{name}: ranks disagree")
    return problems


def _matrix_worker(rank, world, cases):
    problems = []
    for i, case in enumerate(cases):
        problems += _check_case(rank, world, *case, seed=i)
    return problems


def _cases(world, full):
    cases = []
    for algo, (rs, ag), dtype, numel in itertools.product(ALGOS, BITS, DTYPES, NUMELS):
        if not full and numel == 65539 and (dtype != torch.float32 or (rs, ag) not in BITS[:3]):
            continue  # the big message once per algorithm and bit pair in the quick run
        cases.append((algo, rs, ag, dtype, numel))
    return cases


@pytest.mark.parametrize("world", [2, 3, 4])
def test_matrix(world):
    problems = run_ranks(_matrix_worker, world, _cases(world, full=True), timeout=600)
    flat = sorted(set(p for rank_problems in problems for p in rank_problems))
    assert not flat, "\n".join(flat[:30])


def _extras_worker(rank, world):
    problems = []
    # AVG, mixed magnitudes across ranks, world 5 numbers that divide nothing
    for i, algo in enumerate(ALGOS):
        problems += _check_case(rank, world, algo, 8, 8, torch.float32, 4099, 100 + i, average=True)
        problems += _check_case(
            rank, world, algo, 4, 8, torch.bfloat16, 3001, 200 + i, kind="mixed"
        )
    # the number of microshards changes the pipelining, never the result
    xs = _inputs(world, 20000, torch.float32, 7)
    outs = []
    for shards in (1, 5, 64):
        qcomm.set_config(qcomm.QuantConfig(algorithm="ring", min_bytes=0, microshards=shards))
        y = xs[rank].clone()
        dist.all_reduce(y)
        outs.append(y)
    if not all(torch.equal(outs[0], o) for o in outs[1:]):
        problems.append("microshards changed the ring's result")
    # in place on a non-contiguous view; async_op; 2-D shape
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0))
    base = _inputs(world, 4096, torch.float32, 8)
    m = base[rank].clone().view(64, 64)
    view = m.t()  # non-contiguous
    want = ref.allreduce([b.view(64, 64).t().contiguous().flatten() for b in base]).out.view(64, 64)
    work = dist.all_reduce(view, async_op=True)
    ok = work.wait()
    fut = work.get_future().wait()
    if not (ok and work.is_completed() and torch.equal(view, want) and torch.equal(fut[0], view)):
        problems.append("non-contiguous async allreduce: wrong result or Work state")
    if not torch.equal(m.t(), want):
        problems.append("the result did not land in the caller's storage")
    return problems


def test_avg_mixed_microshards_inplace_async():
    _assert_no_problems(_extras_worker, 5, timeout=300)


def _nonfinite_worker(rank, world):
    problems = []
    for algo, (rs, ag) in itertools.product(ALGOS, BITS):
        qcomm.set_config(qcomm.QuantConfig(algorithm=algo, rs_bits=rs, ag_bits=ag, min_bytes=0))
        x = torch.randn(1024, generator=torch.Generator().manual_seed(rank))
        if rank == 1:
            x[100] = float("nan")
            x[700] = float("inf")
        dist.all_reduce(x)
        if torch.isfinite(x[100]) or torch.isfinite(x[700]):
            problems.append(f"{algo} {rs}/{ag}: a NaN/Inf input came out finite")
        if not bool(torch.isfinite(x[300:600]).all()):
            problems.append(f"{algo} {rs}/{ag}: non-finite leaked beyond the groups that held it")
        if not _ranks_agree(x, world):
            problems.append(f"{algo} {rs}/{ag}: ranks disagree")
    return problems


def _large_result_worker(rank, world):
    # decodes of 8 MiB and more into the result stream past the cache (CpuCodecOps::decodeResult):
    # a message whose pieces are that large, with a NaN and a short last group
    problems = []
    qcomm.set_config(qcomm.QuantConfig(algorithm="two_step", min_bytes=0, microshards=1))
    xs = _inputs(world, (4 << 20) + 77, torch.float32, seed=7)
    xs[1][5] = float("nan")
    x = xs[rank].clone()
    dist.all_reduce(x)
    r = ref.allreduce(xs, "two_step", 8, 8)
    if not _same_bits(x, r.out):
        problems.append("a large result differs from the reference")
    if not _ranks_agree(x, world):
        problems.append("a large result: ranks disagree")
    return problems


def test_large_result_matches_reference():
    _assert_no_problems(_large_result_worker, 2, timeout=300)


def test_nonfinite_stays_nonfinite():
    _assert_no_problems(_nonfinite_worker, 3)
