"""qcomm's helpers under torch's debug modes: TORCH_DISTRIBUTED_DEBUG=DETAIL wraps every backend
of a group in torch's ProcessGroupWrapper (which checks each collective's shape across ranks), and
qcomm.stats, set_config, get_config, plan and backend_of see through it."""

import os

import pytest
import torch
import torch.distributed as dist

import qcomm

from dist_util import run_ranks


def _helpers_worker(rank, world):
    out = {}
    be = qcomm.backend_of()
    out["backend"] = type(be).__name__
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0, algorithm="ring"))
    out["config"] = qcomm.get_config().algorithm
    x = torch.full((4096,), float(rank + 1))
    out["plan"] = qcomm.plan(x)["algorithm"]
    dist.all_reduce(x)
    out["sum"] = float(x[0])
    out["quantized"] = qcomm.stats()["quantized_calls"]
    qcomm.reset_stats()
    out["after_reset"] = qcomm.stats()["quantized_calls"]
    sub = dist.new_group([0, 1], backend="qnccl", pg_options=qcomm.QuantConfig(min_bytes=0))
    out["sub"] = qcomm.get_config(sub).algorithm
    return out


@pytest.mark.parametrize("level", ["DETAIL", "INFO"])
def test_helpers_work_under_torch_distributed_debug(level):
    for out in run_ranks(_helpers_worker, 2, env={"TORCH_DISTRIBUTED_DEBUG": level}):
        assert out["backend"] == "QncclBackend", out
        assert out["config"] == "ring" and out["plan"] == "ring" and out["sub"] == "auto", out
        assert abs(out["sum"] - 3.0) < 0.05 and out["quantized"] == 1, out
        assert out["after_reset"] == 0, out


def _check_on_one_rank_worker(rank, world):
    # QCOMM_DEBUG=CHECK on rank 0 only: its eager CUDA calls would wait in a host all-gather while
    # the others wait in the CUDA-IPC barrier, until the group's timeout. The group agrees at its
    # creation: every rank checks if any asks.
    if rank == 0:
        os.environ["QCOMM_DEBUG"] = "CHECK"
    qcomm.reload_settings()
    sub = dist.new_group([0, 1], backend="qnccl")
    checks = qcomm.backend_of(sub).check_calls()
    os.environ.pop("QCOMM_DEBUG", None)
    qcomm.reload_settings()
    plain = dist.new_group([0, 1], backend="qnccl")
    return checks, qcomm.backend_of(plain).check_calls()


def test_ranks_agree_on_checking_calls_at_creation():
    for rank, (checks, plain) in enumerate(run_ranks(_check_on_one_rank_worker, 2)):
        assert checks, f"rank {rank} does not check the calls that rank 0 checks"
        assert not plain, f"rank {rank} checks calls that no rank asked to check"
