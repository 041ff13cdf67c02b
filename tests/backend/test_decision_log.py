"""QCOMM_DEBUG=INFO's decision log: once per group and size class, rank 0 says whether its
allreduces are quantized (how) or passed through (why); and a group whose config asks to
quantize but which passed its first 100 eligible allreduces through says so once."""

import re

import pytest
import torch
import torch.distributed as dist

import qcomm

from dist_util import run_ranks


def _log_worker(rank, world):
    for _ in range(3):
        dist.all_reduce(torch.ones(1024))  # 4 KiB: below min_bytes
        dist.all_reduce(torch.ones(1 << 19))  # 2 MiB: quantized
        dist.all_reduce(torch.ones(8, dtype=torch.int64))  # not an eligible dtype
    quiet = dist.new_group([0, 1], backend="qnccl")
    for _ in range(100):
        dist.all_reduce(torch.ones(256), group=quiet)
    return qcomm.stats()["quantized_calls"]


@pytest.mark.parametrize("level", ["INFO", "CHECK"])  # CHECK: INFO's log and the host checks
def test_the_decision_log_says_once_what_each_size_class_does(capfd, level):
    assert run_ranks(_log_worker, 2, env={"QCOMM_DEBUG": level}) == [3, 3]
    err = capfd.readouterr().err
    lines = [x for x in err.splitlines() if "INFO allreduce" in x]
    assert len(lines) == 5, lines  # 4 KiB, 2 MiB, int64; the quiet group's 1 KiB; its summary
    assert all(x.startswith("[qcomm rank 0/2] INFO allreduce") for x in lines), lines
    joined = "\n".join(lines)
    assert re.search(
        r"of 4 KiB to 8 KiB \(float32\): passed through: message below min_bytes", joined
    )
    assert re.search(r"of 2 MiB to 4 MiB \(float32\): quantized with two_step 8/8", joined), joined
    assert "(int64): passed through: dtype is not fp32, fp16 or bf16" in joined, joined
    assert "of 1 KiB to 2 KiB (float32): passed through: message below min_bytes" in joined
    summary = [x for x in lines if "none of them quantized" in x]
    assert len(summary) == 1 and "100 allreduces of fp32, fp16 or bf16 tensors" in summary[0]


def test_without_info_nothing_is_logged(capfd):
    run_ranks(_log_worker, 2)
    assert "INFO" not in capfd.readouterr().err
