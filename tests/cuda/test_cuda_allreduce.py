"""Quantized allreduce of CUDA tensors over the CUDA-IPC transport: the separate kernels (the NCCL
transport's codec kernels, the bytes copied through the IPC buffers between barrier kernels,
csrc/transport/ipc_exchange.h), the only kernels of a default build.

Ranks are processes that share one GPU (NCCL refuses two ranks on one GPU; CUDA IPC does not):
world sizes 2 and 4 on cuda:0. Every result must equal qcomm/reference.py bit for bit (so every
rank holds the same bits, and the CPU path's), lie within the codec's bound of the exact sum, and
land in place. Processes that share a GPU run by time-slicing, so nothing here is timed. The GPU
tests skip without a GPU and the CUDA build; their workers are tests/transport/ipc_cases.py's.
The exchange emulated on the CPU is tests/transport/test_ipc_exchange.py; the fused two_step
experiment's tests are tests/experiments/test_ipc_fused.py (QCOMM_EXPERIMENTS=1 builds only).
"""

import os
import sys

import pytest
import torch
import torch.distributed as dist
from checks import gpu

import qcomm
from qcomm import reference as ref

from dist_util import run_ranks

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TESTS, "transport"))  # ipc_cases, for the spawned ranks too
import ipc_cases as ipc  # noqa: E402

ENV = ipc.ENV


def _transport_worker(rank, world):
    x = torch.ones(1 << 20)
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0))
    dist.all_reduce(x)  # a CPU allreduce chooses no CUDA transport
    return {**qcomm.cuda_transport(), "profile": qcomm.cuda_ipc_profile()}


def test_cuda_transport_is_unchosen_until_a_cuda_allreduce():
    got = run_ranks(_transport_worker, 2, timeout=120)
    assert [g["transport"] for g in got] == ["", ""], got
    assert [g["kernels"] for g in got] == ["", ""], got
    assert [g["profile"] for g in got] == [{}, {}], got
    if not qcomm.compiled_with_cuda():
        assert all("without CUDA" in g["note"] for g in got), got


# ---- the GPU ----


@gpu
@pytest.mark.parametrize("world", [2, 4])
def test_ipc_two_step_matches_the_reference(world):
    env = {**ENV, "QCOMM_IPC_KERNELS": "separate"}
    ipc.assert_no_problems(ipc.matrix_worker, world, timeout=400, env=env)


@gpu
@pytest.mark.parametrize("world", [2, 4])
def test_ipc_two_step_rotated_matches_the_reference(world):
    # the rotated kernels between ranks (rotation is on by default for a 4-bit phase); the matrix
    # above runs unrotated. Not yet run on a GPU.
    env = {**ENV, "QCOMM_IPC_KERNELS": "separate"}
    ipc.assert_no_problems(ipc.rotated_worker, world, timeout=300, env=env)


@gpu
@pytest.mark.parametrize("buffer_mb", ["32", "1"])
@pytest.mark.parametrize("algorithm", ["ring", "semi_ring"])
@pytest.mark.parametrize("world", [2, 4])
def test_ipc_rings_match_the_reference(world, algorithm, buffer_mb):
    # the rings' hops as point-to-point legs through the IPC buffers, in one round per hop (32 MiB)
    # and in several (1 MiB). Verified so far only through the host emulation on the CPU
    # (tests/transport/test_ipc_exchange.py): this has not run on a GPU yet.
    env = {**ENV, "QCOMM_IPC_KERNELS": "separate", "QCOMM_IPC_BUFFER_MB": buffer_mb}
    ipc.assert_no_problems(ipc.rings_worker, world, algorithm, timeout=400, env=env)


@gpu
@pytest.mark.parametrize("world", [2, 4])
def test_ipc_reduce_scatter_and_all_gather_match_the_reference(world):
    # the sharded calls of CUDA tensors through the allreduce's schedules over CUDA IPC (the reduce
    # half; the gather phase alone) with the CUDA codec and its multiply kernel (PREMUL_SUM).
    # Verified on the CPU by the SIMT schedules check and the IPC emulation only: not yet run on
    # a GPU.
    env = {**ENV, "QCOMM_IPC_KERNELS": "separate"}
    ipc.assert_no_problems(ipc.sharded_worker, world, timeout=300, env=env)


@gpu
def test_ipc_separate_kernels_exchange_in_rounds():
    # a 1 MiB buffer: each exchange takes many rounds
    env = {**ENV, "QCOMM_IPC_KERNELS": "separate", "QCOMM_IPC_BUFFER_MB": "1"}
    ipc.assert_no_problems(ipc.pieces_worker, 2, timeout=300, env=env)


@gpu
def test_ipc_streams_work_and_errors():
    env = {**ENV, "QCOMM_IPC_KERNELS": "separate"}
    ipc.assert_no_problems(ipc.semantics_worker, 2, timeout=300, env=env)


def _ordering_worker(rank, world):
    # IPC calls share the group's buffers and barrier counts, so they must not overlap, whatever
    # streams their callers are on: an async call still outstanding while a sync call runs, and
    # sync calls issued under two different streams, all give the reference's bits.
    torch.cuda.set_device(0)
    qcomm.set_config(ipc.two_step(8, 8))
    problems = []
    n = 300001
    ins = [ipc.inputs(world, n, torch.float32, 600 + i) for i in range(4)]
    want = [ref.allreduce(xs, "two_step", 8, 8).out for xs in ins]
    a, b = ins[0][rank].cuda(), ins[1][rank].cuda()
    work = dist.all_reduce(a, async_op=True)
    dist.all_reduce(b)
    work.wait()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    c, d = ins[2][rank].cuda(), ins[3][rank].cuda()
    torch.cuda.synchronize()
    with torch.cuda.stream(s1):
        dist.all_reduce(c)
    with torch.cuda.stream(s2):
        dist.all_reduce(d)
    torch.cuda.synchronize()
    for name, got, w in zip(["async", "sync", "stream 1", "stream 2"], [a, b, c, d], want):
        if not ipc.same_bits(got.cpu(), w):
            problems.append(f"{name}: differs from the reference")
    return problems


@gpu
def test_ipc_calls_on_different_streams_do_not_overlap():
    ipc.assert_no_problems(_ordering_worker, 2, timeout=300, env=ENV)


@gpu
def test_ipc_setup_agrees_on_settings_or_fails_on_every_rank():
    # the buffer size, different on two ranks: IPC is refused on every rank, naming the setting
    ipc.assert_settings_differ_refused("QCOMM_IPC_BUFFER_MB", ("1", "2"))
    # IPC required on one rank and impossible: every rank raises (no rank waits for the other)
    got = run_ranks(
        ipc.setup_worker,
        2,
        [{"QCOMM_TRANSPORT": "ipc", "QCOMM_IPC_BUFFER_MB": "1"}, {"QCOMM_IPC_BUFFER_MB": "2"}],
        timeout=180,
        env=ENV,
    )
    for g in got:
        assert "QCOMM_TRANSPORT=ipc on rank 0" in g["raised"], got
    # an invalid setting on one rank: it raises a ValueError naming it, the other raises too.
    # QCOMM_IPC_KERNELS=fused is invalid without the experiments (QCOMM_EXPERIMENTS=1 builds).
    kernels = "both" if qcomm._C.compiled_with_experiments() else "fused"
    for name, value in [("QCOMM_IPC_BUFFER_MB", "lots"), ("QCOMM_IPC_KERNELS", kernels)]:
        ipc.assert_invalid_setting_refused(name, value)


@gpu
def test_ipc_error_before_the_launches_stops_the_peers():
    # an error on one rank before its call's launches takes the abort path: the peer waiting in
    # the first barrier stops at once (the spin bound is 60 s here; the check allows 30)
    env = {**ENV, "QCOMM_IPC_KERNELS": "separate", "QCOMM_IPC_SPIN_TIMEOUT_MS": "60000"}
    ipc.assert_no_problems(ipc.abort_before_call_worker, 2, timeout=300, env=env)


@gpu
def test_ipc_mixed_cpu_and_cuda_calls_keep_the_gloo_order():
    env = {**ENV, "QCOMM_IPC_KERNELS": "separate"}
    ipc.assert_no_problems(ipc.mixed_devices_worker, 2, timeout=300, env=env)


@gpu
def test_ipc_two_step_in_a_cuda_graph_replays_with_changing_inputs():
    env = {**ENV, "QCOMM_IPC_KERNELS": "separate"}
    ipc.assert_no_problems(ipc.graph_worker, 2, 100, timeout=400, env=env)
