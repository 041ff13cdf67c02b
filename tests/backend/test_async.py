"""The CPU engine: a quantized allreduce of host tensors runs on its group's progress thread, in
issue order with the pass-through calls, and behaves as Gloo's async work does (wait, is_completed,
the future and its callbacks, errors at wait, destroy with calls queued, no thread left behind)."""

import datetime
import os
import time

import pytest
import torch
import torch.distributed as dist

import qcomm
from qcomm import _testing
from qcomm import reference as ref

from dist_util import first_answer, peer_fault, run_ranks, short_timeout_group


def _inputs(k, world, n=4096):
    return [
        torch.randn(n + k, generator=torch.Generator().manual_seed(k * 31 + r))
        for r in range(world)
    ]


# ---- order, results, the Work ----


def _order_worker(rank, world):
    """Quantized and pass-through calls interleaved, all async, waited at the end: each result is
    what the same call gives alone (the reference for the quantized ones, exact for the others)."""
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0))
    problems = []
    works, checks = [], []
    for k in range(12):
        xs = _inputs(k, world)
        q = xs[rank].clone()
        works.append(dist.all_reduce(q, async_op=True))
        checks.append((f"quantized {k}", q, ref.allreduce(xs).out))
        b = torch.full((257,), float(rank * 100 + k))
        works.append(dist.broadcast(b, src=k % world, async_op=True))
        checks.append((f"broadcast {k}", b, torch.full((257,), float((k % world) * 100 + k))))
        i = torch.full((33,), rank + k, dtype=torch.int64)  # not quantized: exact
        works.append(dist.all_reduce(i, async_op=True))
        checks.append((f"int {k}", i, torch.full((33,), sum(r + k for r in range(world)))))
        g = [torch.empty(5) for _ in range(world)]
        works.append(dist.all_gather(g, torch.full((5,), float(rank + k)), async_op=True))
        checks.append(
            (f"gather {k}", g, torch.stack([torch.full((5,), float(r + k)) for r in range(world)]))
        )
    for w in works:
        w.wait()
    for name, got, want in checks:
        if isinstance(got, list):
            got = torch.stack(got)
        if not torch.equal(got, want):
            problems.append(name)
    return problems


def test_async_calls_keep_issue_order_with_pass_through_calls():
    for problems in run_ranks(_order_worker, 3):
        assert problems == []


def _reverse_worker(rank, world):
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0))
    xs = [_inputs(k, world, 1000) for k in range(100)]
    bufs = [x[rank].clone() for x in xs]
    works = [dist.all_reduce(b, async_op=True) for b in bufs]
    bad = []
    for k in reversed(range(100)):
        works[k].wait()
    for k in range(100):
        if not works[k].is_completed() or not torch.equal(bufs[k], ref.allreduce(xs[k]).out):
            bad.append(k)
    return bad


def test_hundred_outstanding_waited_in_reverse_order():
    for bad in run_ranks(_reverse_worker, 2):
        assert bad == []


def _seq_identity_worker(rank, world, mode, cfg):
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0, **cfg))
    outs, works = [], []
    for k in range(6):
        x = _inputs(k, world, 30000)[rank].clone()
        if mode == "sync":
            dist.all_reduce(x)
        else:
            works.append(dist.all_reduce(x, async_op=True))
        outs.append(x)
    for w in works:
        w.wait()
    return [o.numpy() for o in outs]  # by value: a tensor would travel as shared memory


@pytest.mark.parametrize(
    "cfg",
    [{}, {"rs_bits": 4, "ag_bits": 4, "stochastic_rounding": True}],
    ids=["8/8", "4/4 stochastic"],
)
def test_async_results_match_sync_bit_for_bit(cfg):
    """Stochastic rounding too: the call's sequence number seeds it, taken at issue."""
    sync = run_ranks(_seq_identity_worker, 2, "sync", cfg)
    asyn = run_ranks(_seq_identity_worker, 2, "async", cfg)
    for r in range(2):
        assert len(sync[r]) == len(asyn[r]) == 6
        for a, b in zip(sync[r], asyn[r]):
            assert a.tobytes() == b.tobytes()


def _work_api_worker(rank, world):
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0))
    xs = _inputs(0, world, 1 << 20)  # 4 MiB: long enough to see it pending
    x = xs[rank].clone()
    w = dist.all_reduce(x, async_op=True)
    fut = w.get_future()
    chained = fut.then(lambda f: f.value()[0] * 2)
    while not w.is_completed():
        time.sleep(0.001)
    assert w.is_success()
    assert chained.wait().data_ptr() != x.data_ptr()
    want = ref.allreduce(xs).out
    return (
        torch.equal(x, want),
        torch.equal(chained.wait(), want * 2),
        torch.equal(fut.value()[0], want),
        w.result()[0].data_ptr() == x.data_ptr(),
    )


def test_work_future_and_callbacks():
    for same, chained, value, result in run_ranks(_work_api_worker, 2):
        assert same and chained and value and result


# ---- profiler ----


def _profiler_worker(rank, world):
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0, rs_bits=8, ag_bits=8))
    x = torch.randn(1 << 20)
    dist.all_reduce(x)  # warm
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        dist.all_reduce(x)
        wall_us = (time.perf_counter() - t0) * 1e6
    events = [
        (e.name, e.cpu_time_total) for e in prof.events() if e.name.startswith("qnccl:all_reduce")
    ]
    return events, wall_us


def test_profiler_record_covers_the_quantized_work():
    for events, wall_us in run_ranks(_profiler_worker, 2):
        assert events, "no qnccl:all_reduce record"
        name, us = events[0]
        assert "two_step 8/8 g" in name, name
        # the record spans the work (issue to completion), not an empty marker
        assert us >= 0.5 * wall_us, (us, wall_us)


# ---- two groups, opposite orders ----


def _opposite_worker(rank, world):
    cfg = qcomm.QuantConfig(min_bytes=0)
    g1 = dist.new_group([0, 1], backend="qnccl", pg_options=cfg)
    g2 = dist.new_group([0, 1], backend="qnccl", pg_options=cfg)
    a, b = torch.full((1 << 18,), 1.0), torch.full((1 << 18,), 2.0)
    t0 = time.monotonic()
    order = [(a, g1), (b, g2)] if rank == 0 else [(b, g2), (a, g1)]
    works = [dist.all_reduce(t, group=g, async_op=True) for t, g in order]
    for w in works:
        w.wait()
    seconds = time.monotonic() - t0
    dist.destroy_process_group(g1)
    dist.destroy_process_group(g2)
    return seconds, float(a[0]), float(b[0])


def test_async_calls_on_two_groups_in_opposite_orders_finish():
    for seconds, a, b in run_ranks(_opposite_worker, 2, timeout=120):
        assert abs(a - 2.0) < 0.02 and abs(b - 4.0) < 0.04, (a, b)
        assert seconds < 30, seconds


# ---- a CUDA call's host agreement keeps Gloo's order with the queued calls ----


def _cuda_agreement_worker(rank, world):
    """A quantized CUDA call's host agreement (call_cuda.cpp runCuda's, issued from the
    caller's thread as the CUDA path issues it) while host-memory calls are queued on rank 0 and
    none on rank 1. Both ranks issue L and A async, then the agreement; on rank 0, L stops a second
    at the group's buffers (held) after its header exchange, so A is still queued when the
    agreement is issued; rank 1 waits for A first. Gloo pairs collectives by their order on each
    rank: an agreement run on the caller's thread goes before A's header exchange on rank 0 and
    after it on rank 1, and they pair crosswise (both raise a mismatch); run behind the queued
    calls, it goes after A on both, and every result is the reference's."""
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0))
    be = qcomm.backend_of()
    big, small = _inputs(1, world, 1 << 16), _inputs(2, world)
    xl, xa = big[rank].clone(), small[rank].clone()
    if rank == 0:
        _testing.hold_buffer_lock(be, 1.0)
    works = {"L": dist.all_reduce(xl, async_op=True), "A": dist.all_reduce(xa, async_op=True)}
    problems = []
    if rank == 1:
        try:
            works["A"].wait()
        except RuntimeError as e:
            problems.append(f"A: {e}")
    t0 = time.monotonic()
    try:
        _testing.agree_as_cuda_calls_do(
            be, torch.empty(1000), timeout=datetime.timedelta(seconds=20)
        )
    except RuntimeError as e:
        problems.append(f"the agreement: {e}")
    took = time.monotonic() - t0
    for name, w in works.items():
        try:
            w.wait()
        except RuntimeError as e:
            problems.append(f"{name}: {e}")
    for name, got, xs in (("L", xl, big), ("A", xa, small)):
        if not torch.equal(got, ref.allreduce(xs).out):
            problems.append(f"{name}: differs from the reference")
    return problems, took


def test_a_cuda_calls_host_agreement_pairs_behind_the_queued_calls():
    # issue 37, defect 7, through a CPU seam: the agreement step itself, not the CUDA launch
    results = run_ranks(_cuda_agreement_worker, 2, timeout=90)
    for rank, (problems, _) in enumerate(results):
        assert problems == [], f"rank {rank}: " + "\n".join(problems)
    # rank 0's agreement waited for the calls queued before it (L held a second)
    assert results[0][1] > 0.8, results[0][1]


# ---- errors at wait, the group afterwards ----


def _fault_rank(rank, world, init_file, mode, timeout_s, out):
    import qcomm  # noqa: F401

    short_timeout_group(init_file, rank, world, timeout_s, qcomm.QuantConfig(min_bytes=0))
    if rank == 1:
        peer_fault(mode, timeout_s)
    t0 = time.monotonic()
    w = dist.all_reduce(torch.ones(100000), async_op=True)
    issued = time.monotonic() - t0
    try:
        w.wait()
        out.put(("no error", 0.0, issued, ""))
        return
    except RuntimeError as e:
        msg, seconds = str(e), time.monotonic() - t0
    t1 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(100000))
        nxt = "no error"
    except RuntimeError as e:
        nxt = str(e)
    nxt_seconds = time.monotonic() - t1
    dist.destroy_process_group()
    out.put((msg, seconds, issued, nxt, nxt_seconds))


@pytest.mark.parametrize("mode", ["dies", "stalls"])
def test_peer_fault_surfaces_at_wait_and_the_group_says_so_next(mode, tmp_path):
    timeout_s = 6
    (msg, seconds, issued, nxt, nxt_seconds), code = first_answer(
        _fault_rank, 2, str(tmp_path / "store"), mode, timeout_s, timeout=timeout_s * 4 + 60
    )
    assert "[qcomm rank 0/2] allreduce" in msg, msg
    assert seconds <= timeout_s + 5, seconds
    assert issued < 1.0, issued  # the call itself returned before the fault showed
    assert "cannot be used after an earlier quantized collective on it failed" in nxt, nxt
    assert nxt_seconds < 1.0, nxt_seconds  # at once, not another timeout
    assert code == 0


# ---- destroy with calls queued; threads ----


def _destroy_queued_worker(rank, world):
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0))
    bufs = [torch.full((1 << 18,), float(rank + 1)) for _ in range(8)]
    works = [dist.all_reduce(b, async_op=True) for b in bufs]
    t0 = time.monotonic()
    dist.destroy_process_group()  # every rank destroys with its calls queued: they run first
    seconds = time.monotonic() - t0
    return (
        seconds,
        [w.is_completed() for w in works],
        [float(b[0]) for b in bufs],
        _testing.progress_threads(),
    )


def test_destroy_with_calls_queued_runs_them_and_leaves_no_thread():
    for seconds, done, firsts, threads in run_ranks(_destroy_queued_worker, 2, backend="qnccl"):
        assert all(done), done
        assert all(abs(f - 3.0) < 0.03 for f in firsts), firsts
        assert threads == 0
        assert seconds < 60


def _destroy_alone_rank(rank, world, init_file, out):
    import qcomm

    short_timeout_group(init_file, rank, world, 4, qcomm.QuantConfig(min_bytes=0))
    if rank == 1:
        time.sleep(30)  # never issues the calls rank 0 queued (first_answer stops it)
        os._exit(0)
    works = [dist.all_reduce(torch.ones(50000), async_op=True) for _ in range(5)]
    t0 = time.monotonic()
    dist.destroy_process_group()
    seconds = time.monotonic() - t0
    errors = []
    for w in works:
        try:
            w.wait()
            errors.append("")
        except RuntimeError as e:
            errors.append(str(e))
    out.put((seconds, errors, _testing.progress_threads()))


def test_destroy_with_calls_a_peer_never_issues_ends_within_the_timeout(tmp_path):
    (seconds, errors, threads), _ = first_answer(_destroy_alone_rank, 2, str(tmp_path / "s"))
    # the first call times out (4 s); the rest fail at once (the group is broken) or were never
    # started: no call is left hanging, and destroy returned within about one timeout
    assert seconds < 4 + 6, seconds
    assert all(e.startswith("[qcomm rank 0/2]") for e in errors), errors
    assert threads == 0


def _threads_of_this_process():
    return len(os.listdir("/proc/self/task"))


def _thread_count_worker(rank, world, init_file):
    counts = []
    for round_ in range(4):
        from qcomm.spawn import file_barrier

        file_barrier(os.path.dirname(init_file), f"t{round_}", rank, world)
        dist.init_process_group(
            "qnccl",
            init_method=f"file://{init_file}.{round_}",
            rank=rank,
            world_size=world,
            pg_options=qcomm.QuantConfig(min_bytes=0),
        )
        works = [dist.all_reduce(torch.ones(20000), async_op=True) for _ in range(4)]
        for w in works:
            w.wait()
        assert _testing.progress_threads() == 1
        dist.destroy_process_group()
        counts.append((_threads_of_this_process(), _testing.progress_threads()))
    return counts


def test_no_thread_left_after_destroy(tmp_path):
    for counts in run_ranks(_thread_count_worker, 2, str(tmp_path / "store"), backend=None):
        assert all(p == 0 for _, p in counts), counts
        # the process's threads do not grow with each group created and destroyed
        assert counts[-1][0] <= counts[0][0], counts


# ---- DDP with an async comm hook ----


def _ddp_hook_worker(rank, world):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)
    )
    ddp = DDP(model, bucket_cap_mb=0.25)
    buckets = []  # (this rank's input, the allreduced sum) per bucket

    def hook(state, bucket):
        given = bucket.buffer().clone()
        fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()

        def done(f):
            buckets.append((given.numpy(), f.value()[0].clone().numpy()))
            return f.value()[0] / world

        return fut.then(done)

    ddp.register_comm_hook(None, hook)
    for step in range(2):  # DDP rebuilds its buckets after the first step
        model.zero_grad()
        x = torch.randn(64, 256, generator=torch.Generator().manual_seed(rank * 10 + step))
        ddp(x).square().mean().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    return grads.numpy(), buckets, qcomm.stats()["quantized_calls"]


def test_ddp_with_an_async_comm_hook():
    (g0, b0, q0), (g1, b1, _) = run_ranks(
        _ddp_hook_worker, 2, pg_options=qcomm.QuantConfig(min_bytes=0)
    )
    assert len(b0) >= 3 and q0 >= len(b0)  # several buckets, each quantized
    assert g0.tobytes() == g1.tobytes()  # identical on every rank
    # each bucket's sum is bit for bit what the reference codec gives for the two ranks' inputs
    assert len(b0) == len(b1)
    for (in0, out0), (in1, out1) in zip(b0, b1):
        assert out0.tobytes() == out1.tobytes()
        want = ref.allreduce([torch.from_numpy(in0), torch.from_numpy(in1)]).out
        assert torch.equal(torch.from_numpy(out0), want)
