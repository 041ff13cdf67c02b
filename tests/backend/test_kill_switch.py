"""QCOMM_DISABLE=1, the operator's switch: every collective of a group created with it passes
through exactly, whatever config the code passes or sets later; ranks that disagree on it raise at
the group's creation, naming it."""

import os

import torch
import torch.distributed as dist

import qcomm

from dist_util import run_ranks


def _disabled_worker(rank, world):
    out = {}
    x = torch.randn(4096, generator=torch.Generator().manual_seed(rank))
    want = x.clone()
    gloo = dist.new_group(backend="gloo")
    dist.all_reduce(want, group=gloo)
    y = x.clone()
    dist.all_reduce(y)  # the default group: created with pg_options asking to quantize
    out["exact"] = torch.equal(y, want)
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0, algorithm="ring"))  # code cannot undo it
    y = x.clone()
    dist.all_reduce(y)
    out["exact_after_set"] = torch.equal(y, want)
    out["plan"] = qcomm.plan(x)
    out["stats"] = qcomm.stats()
    return out


def test_disable_passes_everything_through_whatever_the_config():
    results = run_ranks(
        _disabled_worker,
        2,
        pg_options=qcomm.QuantConfig(min_bytes=0),
        env={"QCOMM_DISABLE": "1"},
    )
    for out in results:
        assert out["exact"] and out["exact_after_set"], out
        assert out["plan"]["quantize"] is False and "QCOMM_DISABLE" in out["plan"]["reason"], out
        assert out["stats"]["quantized_calls"] == 0 and out["stats"]["passthrough_calls"] >= 2


def _disagree_worker(rank, world):
    os.environ["QCOMM_DISABLE"] = "1" if rank == 0 else "0"
    try:
        dist.new_group([0, 1], backend="qnccl")
        raised = ""
    except ValueError as e:
        raised = str(e)
    os.environ.pop("QCOMM_DISABLE")
    x = torch.ones(8)
    dist.all_reduce(x)  # the default group still works
    return raised, float(x[0])


def test_ranks_that_disagree_on_disable_raise_at_creation():
    for rank, (raised, value) in enumerate(run_ranks(_disagree_worker, 2)):
        assert "QCOMM_DISABLE differs" in raised and "rank 0: 1" in raised, raised
        assert f"[qcomm rank {rank}/2]" in raised, raised
        assert value == 2.0
