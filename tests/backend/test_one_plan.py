"""Issue 47: one quantized call. Every collective call reaching the backend (allreduce,
reduce-scatter and all-gather, tensor and list forms, quantized or passed through, `auto` with
the tuner on included) makes its plan once: one `makePlan` (csrc/plan/plan.cpp), counted by the
test hook `plans_made`. The allreduce computed it twice at issue and a third time on the queue
with `auto` before; the table's choice is now read at one point, `Tuner::decide`, which does not
plan again."""

import torch
import torch.distributed as dist

import qcomm
from qcomm import _testing

from dist_util import run_ranks

N = 4096  # elements per shard
CFG = qcomm.QuantConfig(min_bytes=0, reduce_scatter=True, all_gather=True, tune=False)


def _calls(rank, world):
    """(name, issue) of each form; issue() runs the call synchronously."""
    x = torch.randn(world * N, generator=torch.Generator().manual_seed(rank))
    shard = x[:N].clone()

    def all_reduce():
        dist.all_reduce(x.clone())

    def all_reduce_small_int():  # passes through (dtype)
        dist.all_reduce(torch.ones(8, dtype=torch.int64))

    def reduce_scatter_tensor():
        dist.reduce_scatter_tensor(torch.empty(N), x.clone())

    def reduce_scatter_list():
        dist.reduce_scatter(torch.empty(N), list(x.clone().chunk(world)))

    def all_gather_tensor():
        dist.all_gather_into_tensor(torch.empty(world * N), shard)

    def all_gather_list():
        dist.all_gather([torch.empty(N) for _ in range(world)], shard)

    return [
        (f.__name__, f)
        for f in (
            all_reduce,
            all_reduce_small_int,
            reduce_scatter_tensor,
            reduce_scatter_list,
            all_gather_tensor,
            all_gather_list,
        )
    ]


def _count_worker(rank, world, tune):
    if tune:
        cfg = qcomm.QuantConfig(min_bytes=0, reduce_scatter=True, all_gather=True, tune=True)
        qcomm.set_config(cfg)
    counts = {}
    for name, issue in _calls(rank, world):
        issue()  # the first call of a class may measure it (the tuner plans its candidates)
        before = _testing.plans_made()
        issue()
        counts[name] = _testing.plans_made() - before
    s = qcomm.stats()
    return counts, s["quantized_calls"], s["tuned_classes"]


def test_each_call_makes_one_plan():
    for rank, (counts, quantized, _) in enumerate(
        run_ranks(_count_worker, 2, False, pg_options=CFG)
    ):
        assert counts == {k: 1 for k in counts}, (rank, counts)
        # the forms did quantize (the count covers the quantized path, not only pass-through)
        assert quantized >= 8, (rank, quantized)


def test_each_auto_call_makes_one_plan_with_the_tuner_on():
    results = run_ranks(_count_worker, 2, True, pg_options=CFG, env={"QCOMM_TUNE": "1"})
    for rank, (counts, _, tuned) in enumerate(results):
        assert counts == {k: 1 for k in counts}, (rank, counts)
        # the table decided: the allreduce's, reduce-scatter's and all-gather's classes measured
        # (the tuner's candidates are planned by quantizedPlan, not makePlan)
        assert tuned >= 3, (rank, tuned)
