"""Mismatches and faults get a clear error: a config that differs across ranks at the group's
creation raises there, on every rank; a call quantized on one rank and passed through on another
(sizes on either side of min_bytes) costs the timeout, and the quantized rank's message names the
likely causes; a peer killed at any moment of a quantized call leaves the survivor a message with
qcomm's prefix, the step and the cause, and the group refuses its next call at once."""

import os
import threading
import time

import pytest
import torch
import torch.distributed as dist

import qcomm

from dist_util import first_answer, run_ranks, short_timeout_group


def _creation_worker(rank, world, init_file):
    t0 = time.monotonic()
    try:
        dist.init_process_group(
            "qnccl",
            init_method=f"file://{init_file}",
            rank=rank,
            world_size=world,
            pg_options=qcomm.QuantConfig(min_bytes=[1 << 20, 1 << 16][rank]),
        )
        return "no error", time.monotonic() - t0
    except ValueError as e:
        return str(e), time.monotonic() - t0


def test_a_config_that_differs_at_creation_raises_there_on_every_rank(tmp_path):
    results = run_ranks(_creation_worker, 2, str(tmp_path / "store"), backend=None)
    for rank, (msg, seconds) in enumerate(results):
        assert msg.startswith(f"[qcomm rank {rank}/2] the ranks create this group with different")
        assert "min_bytes: rank 0: 1048576, rank 1: 65536" in msg, msg
        assert seconds < 30, seconds


def _eligibility_worker(rank, world, init_file):
    short_timeout_group(init_file, rank, world, 5, qcomm.QuantConfig(min_bytes=1 << 18), False)
    # sizes on either side of min_bytes: rank 1's 256 KiB call is quantized, rank 0's 128 KiB call
    # passes through (set_config on one rank can no longer do this: it is collective)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones([1 << 15, 1 << 16][rank]))
        msg = "no error"
    except RuntimeError as e:
        msg = str(e)
    seconds = time.monotonic() - t0
    dist.destroy_process_group()
    return msg, seconds


def test_a_call_quantized_on_one_rank_only_names_the_likely_causes(tmp_path):
    results = run_ranks(_eligibility_worker, 2, str(tmp_path / "store"), backend=None, timeout=120)
    quantized_msg, seconds = results[1]
    assert quantized_msg.startswith("[qcomm rank 1/2] allreduce: "), quantized_msg
    assert "issued a different collective" in quantized_msg, quantized_msg
    assert "min_bytes" in quantized_msg, quantized_msg
    assert seconds < 5 + 10, seconds
    # the pass-through rank gets Gloo's own error (its allreduce met the header's all-gather)
    assert results[0][0] != "no error"


def _killed_rank(rank, world, init_file, algo, delay, out):
    short_timeout_group(init_file, rank, world, 6, qcomm.QuantConfig(algorithm=algo, min_bytes=0))
    if rank == 1:
        threading.Timer(delay, lambda: os._exit(0)).start()  # dies at some moment of a call
    msgs = []
    for _ in range(200):
        try:
            dist.all_reduce(torch.randn(1 << 20))
        except RuntimeError as e:
            msgs.append(str(e))
            if len(msgs) == 2:
                break
    if rank == 0:
        out.put(msgs)
    dist.destroy_process_group()


@pytest.mark.parametrize("algo,delay", [("two_step", 0.05), ("two_step", 0.23), ("ring", 0.11)])
def test_a_killed_peer_leaves_prefixed_messages(algo, delay, tmp_path):
    msgs, _ = first_answer(_killed_rank, 2, str(tmp_path / "s"), algo, delay, timeout=90)
    assert len(msgs) == 2, msgs
    first, second = msgs
    assert first.startswith("[qcomm rank 0/2] allreduce: ") and " failed" in first, first
    assert "cannot be used after an earlier quantized collective" in second, second
