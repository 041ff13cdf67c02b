"""What the CUDA-IPC tests share (tests/transport/test_ipc_exchange.py, tests/cuda/
test_cuda_allreduce.py and the fused experiment's tests/experiments/test_ipc_fused.py): the cases,
the inputs and the bitwise comparison, the matrix of emulated calls checked against
qcomm/reference.py, and the ranks' workers of the GPU tests.

The GPU workers run on ranks that are processes sharing one GPU (NCCL refuses two ranks on one
GPU; CUDA IPC does not), so nothing they do is timed. Every result must equal the reference bit
for bit (so every rank holds the same bits, and the CPU path's), lie within the codec's bound of
the exact sum, and land in place. A test module outside this folder puts it on sys.path first
(spawned ranks inherit the path, so they find the workers too)."""

import itertools
import os
import time

import torch
import torch.distributed as dist

import qcomm
from qcomm import reference as ref

from dist_util import run_ranks

# the quantized CUDA path is opt-in (docs/cuda.md, "The opt-in")
ENV = {"QCOMM_CUDA_QUANTIZE": "1", "QCOMM_IPC_SPIN_TIMEOUT_MS": "20000"}

BITS = [(8, 8), (4, 8), (4, 4), (None, 8), (8, None)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
EMULATED_CASES = list(itertools.product(BITS, DTYPES, [1, 7, 1000, 65539]))


def two_step(rs, ag, symmetric=False, stochastic=False):
    return qcomm.QuantConfig(
        algorithm="two_step",
        rs_bits=rs,
        ag_bits=ag,
        min_bytes=0,
        symmetric=symmetric,
        stochastic_rounding=stochastic,
    )


def ref_allreduce(xs, algorithm="two_step", *args, fused=None, **kwargs):
    """qcomm.reference.allreduce, for the kernels that run the call: the fused two_step experiment
    (fused=True, or QCOMM_IPC_KERNELS=fused in this process's environment) quantizes the owner's
    own values too ("two_step_quantized_own"); the separate kernels run the schedules' two_step."""
    if fused is None:
        fused = os.environ.get("QCOMM_IPC_KERNELS") == "fused"
    if fused and algorithm == "two_step":
        algorithm = "two_step_quantized_own"
    return ref.allreduce(xs, algorithm, *args, **kwargs)


def inputs(world, numel, dtype, seed):
    xs = []
    for r in range(world):
        g = torch.Generator().manual_seed(seed * 1000 + r)
        xs.append(torch.randn(numel, generator=g).to(dtype))
    return xs


def same_bits(a, b):
    na, nb = torch.isnan(a), torch.isnan(b)
    return torch.equal(na, nb) and torch.equal(a[~na], b[~nb])


def emulated_matrix(world, emulate, fused=False):
    """Every bit pair, dtype and size of EMULATED_CASES (AVG, symmetric scales and stochastic
    rounding in some) through emulate(xs, rs, ag, avg, sym, sr, i), bit for bit against the
    reference on every rank (fused: the fused experiment's, ref_allreduce, which is never rotated);
    the problems found."""
    problems = []
    for i, ((rs, ag), dtype, numel) in enumerate(EMULATED_CASES):
        xs = inputs(world, numel, dtype, i)
        avg, sym, sr = i % 3 == 0, i % 5 == 1, i % 7 == 2
        outs = emulate(xs, rs, ag, avg, sym, sr, i)
        want = ref_allreduce(
            xs,
            "two_step",
            rs,
            ag,
            fused=fused,
            rotate=False if fused else None,
            average=avg,
            symmetric=sym,
            stochastic_seq=i if sr else None,
        ).out
        for r, o in enumerate(outs):
            if not same_bits(o, want):
                problems.append(
                    f"rs={rs} ag={ag} {dtype} n={numel} avg={avg} sym={sym} sr={sr} rank {r}: "
                    f"{int((o != want).sum())} elements differ"
                )
    return problems


def assert_no_problems(worker, world, *args, timeout, env):
    """Run `worker` on `world` ranks; each returns a list of problems; none may have any."""
    problems = run_ranks(worker, world, *args, timeout=timeout, env=env)
    flat = sorted(set(p for ps in problems for p in ps))
    assert not flat, "\n".join(flat[:30])


# ---- the ranks' workers of the GPU tests (QCOMM_IPC_KERNELS from the test's env) ----


def case(
    rank,
    world,
    rs,
    ag,
    dtype,
    numel,
    seed,
    average=False,
    symmetric=False,
    stochastic=False,
    async_op=False,
    algorithm="two_step",
    rotate=False,
):
    cfg = two_step(rs, ag, symmetric, stochastic).replace(algorithm=algorithm, rotate=rotate)
    qcomm.set_config(cfg)
    xs = inputs(world, numel, dtype, seed)
    x = xs[rank].cuda()
    seq = qcomm.stats()["next_call_seq"]
    op = dist.ReduceOp.AVG if average else dist.ReduceOp.SUM
    work = dist.all_reduce(x, op=op, async_op=async_op)
    if async_op:
        work.wait()  # the current stream waits; the host does not
    got = x.cpu()
    name = (
        f"{algorithm} rs={rs} ag={ag} {dtype} n={numel} avg={average} sym={symmetric} "
        f"sr={stochastic} async={async_op} rotate={rotate}"
    )
    r = ref_allreduce(
        xs,
        algorithm,
        rs,
        ag,
        symmetric=symmetric,
        average=average,
        rotate=rotate,
        stochastic_seq=seq if stochastic else None,
    )
    problems = []
    if not same_bits(got, r.out):
        diff = (got.double() - r.out.double()).abs().max().item()
        bad = int((got != r.out).sum())
        problems.append(f"{name}: differs from the reference at {bad} elements (max {diff})")
    elif not bool(((got.double() - r.exact).abs() <= r.bound).all()):
        problems.append(f"{name}: outside the codec's bound")
    return problems


def matrix_worker(rank, world):
    torch.cuda.set_device(0)
    problems = []
    i = 0
    for (rs, ag), dtype, numel in itertools.product(BITS, DTYPES, [1, 7, 1000, 65539]):
        i += 1
        problems += case(rank, world, rs, ag, dtype, numel, i)
    chosen = qcomm.cuda_transport()
    if chosen["transport"] != "ipc" or chosen["kernels"] != os.environ.get(
        "QCOMM_IPC_KERNELS", "separate"
    ):
        problems.append(f"transport is {chosen}")
    # AVG, symmetric, stochastic rounding, async on the side stream, a large message
    problems += case(rank, world, 8, 8, torch.float32, 4099, 101, average=True)
    problems += case(rank, world, 4, 8, torch.bfloat16, 5000, 102, symmetric=True)
    problems += case(rank, world, 4, 4, torch.float32, 9000, 103, stochastic=True)
    problems += case(rank, world, 8, 8, torch.bfloat16, 3 * 2**20 + 5, 104, async_op=True)
    problems += case(rank, world, 4, 8, torch.float16, 2**22, 105, average=True)
    return problems


def rings_worker(rank, world, algorithm):
    # ring or semi_ring over CUDA IPC (the separate kernels; its hops are point-to-point legs):
    # with QCOMM_IPC_BUFFER_MB=1 the larger messages take several rounds per hop
    torch.cuda.set_device(0)
    problems = []
    sizes = [7, 65539, 3 * 2**20 + 5]
    for i, ((rs, ag), dtype, numel) in enumerate(
        itertools.product(BITS, [torch.float32, torch.bfloat16], sizes)
    ):
        problems += case(
            rank,
            world,
            rs,
            ag,
            dtype,
            numel,
            500 + i,
            average=i % 2 == 0,
            stochastic=i % 7 == 2,
            algorithm=algorithm,
            rotate=i % 3 == 1,
        )
    if qcomm.cuda_transport()["transport"] != "ipc":
        problems.append(f"transport is {qcomm.cuda_transport()}")
    return problems


def rotated_worker(rank, world):
    # two_step with rotate=True over CUDA IPC (the default wherever a phase has 4 bits): the warp
    # codec's rotated kernels between ranks; 1003 elements end inside a group (a padded copy)
    torch.cuda.set_device(0)
    problems = []
    bits = [(4, 4), (None, 4), (4, 8), (8, 8)]
    for i, ((rs, ag), dtype, numel) in enumerate(
        itertools.product(bits, [torch.float32, torch.bfloat16], [1003, 65539])
    ):
        problems += case(
            rank, world, rs, ag, dtype, numel, 700 + i, average=i % 2 == 1, rotate=True
        )
    return problems


def sharded_worker(rank, world):
    # reduce-scatters (the reduce half of each algorithm; SUM, AVG, PREMUL_SUM; out of place, in
    # place, async, the list form) and all-gathers (out of place, in place into the own slot, the
    # list form) of CUDA tensors over CUDA IPC, bit for bit against the reference; the inputs of
    # the reduce-scatters unchanged; the stats count them
    torch.cuda.set_device(0)
    problems = []
    premul = dist._make_nccl_premul_sum
    for i, (algorithm, dtype, shard) in enumerate(
        itertools.product(
            ["two_step", "ring", "semi_ring"], [torch.float32, torch.bfloat16], [129, 65539]
        )
    ):
        bits = 4 if i % 2 else 8
        qcomm.set_config(
            qcomm.QuantConfig(
                algorithm=algorithm,
                rs_bits=bits,
                ag_bits=8,
                min_bytes=0,
                rotate=False,
                reduce_scatter=True,
                all_gather=True,
            )
        )
        xs = inputs(world, shard * world, dtype, 900 + i)
        name = f"{algorithm} {dtype} shard={shard} rs={bits}"
        for k, (op, factor) in enumerate([("sum", None), ("avg", None), ("premul", 1 / 3)]):
            want = ref.reduce_scatter(xs, algorithm, bits, op=op, factor=factor, rotate=False)[
                rank
            ].out
            red = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}.get(op) or premul(factor)
            x = xs[rank].cuda()
            if k == 1:  # in place: the output is this rank's own shard of the input
                out = x[rank * shard : (rank + 1) * shard]
                dist.reduce_scatter_tensor(out, x, op=red)
            elif k == 2:  # the list form, async
                out = torch.empty(shard, dtype=dtype, device="cuda")
                dist.reduce_scatter(out, list(x.chunk(world)), op=red, async_op=True).wait()
            else:
                out = torch.empty(shard, dtype=dtype, device="cuda")
                dist.reduce_scatter_tensor(out, x, op=red)
                if not torch.equal(x.cpu(), xs[rank]):
                    problems.append(f"reduce-scatter {name}: the input was written")
            if not same_bits(out.cpu(), want):
                problems.append(f"reduce-scatter {name} {op}: differs from the reference")
        shards = [x[:shard].clone() for x in xs]
        want = ref.all_gather(shards, 8).out
        out = torch.empty(shard * world, dtype=dtype, device="cuda")
        dist.all_gather_into_tensor(out, shards[rank].cuda())
        if not same_bits(out.cpu(), want):
            problems.append(f"all-gather {name}: differs from the reference")
        out = torch.zeros(shard * world, dtype=dtype, device="cuda")
        mine = out[rank * shard : (rank + 1) * shard]
        mine.copy_(shards[rank].cuda())
        dist.all_gather_into_tensor(out, mine)  # in place (FSDP2's)
        if not same_bits(out.cpu(), want):
            problems.append(f"all-gather {name} in place: differs from the reference")
        outs = [torch.empty(shard, dtype=dtype, device="cuda") for _ in range(world)]
        dist.all_gather(outs, shards[rank].cuda())
        if not same_bits(torch.cat([o.cpu() for o in outs]), want):
            problems.append(f"all-gather {name} list form: differs from the reference")
    by = qcomm.stats()["by_collective"]
    if by["reduce_scatter"]["quantized_calls"] != 18 or by["all_gather"]["quantized_calls"] != 18:
        problems.append(f"stats: {by}")
    if qcomm.cuda_transport()["transport"] != "ipc":
        problems.append(f"transport is {qcomm.cuda_transport()}")
    return problems


def pieces_worker(rank, world):
    # with QCOMM_IPC_BUFFER_MB=1: each exchange of the separate kernels takes many rounds (a
    # 4M-element message runs as many pieces of the fused kernel, its epochs advancing per piece)
    torch.cuda.set_device(0)
    problems = []
    for seed, (dtype, numel) in enumerate([(torch.float32, 2**22 + 77), (torch.bfloat16, 300001)]):
        problems += case(rank, world, 8, 8, dtype, numel, 300 + seed)
        problems += case(rank, world, 4, 8, dtype, numel, 400 + seed, average=True)
    if os.environ.get("QCOMM_IPC_PROFILE") == "1":
        # profiled (the fused experiment): the results above are unchanged, and every phase of
        # the fused kernel counted
        torch.cuda.synchronize()
        prof = qcomm.cuda_ipc_profile()
        if prof.get("runs", 0) <= 0 or any(v <= 0 for v in prof.values()):
            problems.append(f"profile: {prof}")
    return problems


def semantics_worker(rank, world):
    torch.cuda.set_device(0)
    problems = []
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0))
    xs = inputs(world, 64 * 64, torch.float32, 7)
    want = ref_allreduce([x.view(64, 64).t().contiguous().flatten() for x in xs]).out
    # in place on a non-contiguous view, async: Work, future and stream order
    m = xs[rank].cuda().view(64, 64)
    view = m.t()
    work = dist.all_reduce(view, async_op=True)
    fut = work.get_future()
    work.wait()
    after = (view * 1).contiguous().flatten().cpu()  # enqueued after wait(): must see the result
    if not torch.equal(after, want.view(64, 64).flatten()):
        problems.append("async non-contiguous: wrong result after wait()")
    if not torch.equal(fut.wait()[0].contiguous().flatten().cpu(), want.view(64, 64).flatten()):
        problems.append("the future's value is not the result")
    torch.cuda.synchronize()
    if not work.is_completed():
        problems.append("work not completed after synchronize")
    problems += mismatch_checked(rank, world)
    problems += case(rank, world, 8, 8, torch.float32, 1000, 9)
    problems += mismatch_unchecked(rank)
    # without the opt-in a CUDA allreduce is NCCL's (qcomm.plan says why). A process setting:
    # read once, so the test makes the reader forget it around the change
    os.environ.pop("QCOMM_CUDA_QUANTIZE")
    qcomm.reload_settings()
    p = qcomm.plan(torch.ones(1 << 20, device="cuda"))
    if p["quantize"] or "QCOMM_CUDA_QUANTIZE" not in p["reason"]:
        problems.append(f"plan without the opt-in: {p}")
    os.environ["QCOMM_CUDA_QUANTIZE"] = "1"
    qcomm.reload_settings()
    return problems


def mismatch_checked(rank, world):
    """A group whose calls are checked on the host (QCOMM_DEBUG=CHECK, agreed at its creation): a
    rank whose call differs makes every rank raise at once, naming the field, and the group stays
    usable."""
    problems = []
    os.environ["QCOMM_DEBUG"] = "CHECK"
    qcomm.reload_settings()
    g = dist.new_group(list(range(world)), backend="qnccl", pg_options=two_step(8, 8))
    os.environ.pop("QCOMM_DEBUG")
    qcomm.reload_settings()
    x = torch.ones(1000 + rank, device="cuda")
    try:
        dist.all_reduce(x, group=g)
        problems.append("checked: a numel mismatch did not raise")
    except RuntimeError as e:
        if "numel" not in str(e):
            problems.append(f"checked: the mismatch error does not name numel: {e}")
    y = torch.full((4096,), float(rank + 1), device="cuda")
    dist.all_reduce(y, group=g)
    want = world * (world + 1) / 2
    if not bool(((y.cpu() - want).abs() < 0.05).all()):
        problems.append("checked: the group is not usable after a mismatch")
    return problems


def mismatch_unchecked(rank):
    """The default: the call's first barrier compares plan fingerprints on the device, with no host
    round trip. A rank whose call differs leaves NaN (never numbers) on every rank, the error is
    raised by the next call, naming the fingerprints, and the group cannot continue
    (docs/reliability.md). Last in its worker: the default group is dead after it."""
    problems = []
    x = torch.ones(1000 + rank, device="cuda")
    try:
        dist.all_reduce(x)
        torch.cuda.synchronize()
        if not bool(torch.isnan(x.cpu()).all()):
            problems.append("unchecked: a mismatched call left numbers, not NaN")
    except RuntimeError as e:  # raised by this call when its kernel had already given up
        if "fingerprint" not in str(e):
            problems.append(f"unchecked: the mismatch error does not name the fingerprint: {e}")
    for k in range(2):
        try:
            dist.all_reduce(torch.ones(1000, device="cuda"))
            torch.cuda.synchronize()
            problems.append(f"unchecked: call {k} after the mismatch did not raise")
        except RuntimeError as e:
            if k == 0 and "fingerprint" not in str(e) and "cannot continue" not in str(e):
                problems.append(f"unchecked: the next call's error does not say why: {e}")
    return problems


def abort_before_call_worker(rank, world):
    """Rank 1 fails before its call's launches (out of memory copying a non-contiguous input)
    while rank 0's call waits for it in the first barrier: rank 0's kernels must stop at once (the
    abort path), not spin to the spin bound (60 s in this test), and both ranks' next calls
    raise."""
    torch.cuda.set_device(0)
    problems = []
    qcomm.set_config(two_step(8, 8))
    warm = torch.ones(4096, device="cuda")
    dist.all_reduce(warm)  # sets the transport up
    torch.cuda.synchronize()
    n = 64 << 20  # 256 MiB of fp32
    if rank == 1:
        x = torch.ones(n // 1024, 1024, device="cuda").t()  # not contiguous: copied first
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(
            (torch.cuda.memory_reserved() + (1 << 20)) / total
        )
    else:
        x = torch.ones(n, device="cuda")
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)
        torch.cuda.synchronize()
        if rank == 1:
            problems.append("rank 1: the call did not run out of memory")
    except RuntimeError as e:
        if rank == 1 and "out of memory" not in str(e).lower():
            problems.append(f"rank 1: unexpected error: {e}")
    waited = time.monotonic() - t0
    if rank == 0 and waited > 30:
        problems.append(f"rank 0 waited {waited:.0f} s for a peer that had failed")
    try:
        dist.all_reduce(torch.ones(4096, device="cuda"))
        torch.cuda.synchronize()
        problems.append(f"rank {rank}: the call after the failure did not raise")
    except RuntimeError:
        pass
    return problems


def mixed_devices_worker(rank, world):
    """Host-memory and CUDA allreduces mixed on one group whose CUDA calls agree on the host
    (QCOMM_DEBUG=CHECK): each CPU call queued on the progress thread, then a CUDA call at once.
    The CUDA call's Gloo exchange runs behind the queued CPU calls, so every rank's Gloo sees the
    same order; both results must be the reference's."""
    torch.cuda.set_device(0)
    problems = []
    os.environ["QCOMM_DEBUG"] = "CHECK"
    qcomm.reload_settings()
    g = dist.new_group(list(range(world)), backend="qnccl", pg_options=two_step(8, 8))
    os.environ.pop("QCOMM_DEBUG")
    qcomm.reload_settings()
    for i in range(5):
        xs = inputs(world, 1 << 18, torch.float32, 60 + i)
        want = ref_allreduce(xs, "two_step", 8, 8).out
        cpu = xs[rank].clone()
        work = dist.all_reduce(cpu, group=g, async_op=True)
        gpu = xs[rank].cuda()
        dist.all_reduce(gpu, group=g)
        work.wait()
        if not same_bits(cpu, want) or not same_bits(gpu.cpu(), want):
            problems.append(f"mixed call {i}: a result differs from the reference")
    return problems


def setup_worker(rank, world, settings):
    # per-rank transport settings, read at the group's first quantized CUDA allreduce; returns
    # what each rank raised (or "" when nothing) and the transport it reports
    torch.cuda.set_device(0)
    for k, v in settings[rank].items():
        os.environ[k] = v
    qcomm.set_config(two_step(8, 8))
    x = torch.ones(4096, device="cuda")
    raised = ""
    try:
        dist.all_reduce(x)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 (what each rank raised is the result)
        raised = f"{type(e).__name__}: {e}"
    return {"raised": raised, **qcomm.cuda_transport()}


def assert_settings_differ_refused(name, values):
    """A setting every rank must share, different on two ranks: IPC is refused on every rank,
    naming the setting."""
    got = run_ranks(setup_worker, 2, [{name: v} for v in values], timeout=180, env=ENV)
    for g in got:
        assert g["transport"] == "nccl" and f"{name} differs" in g["note"], got
        # then NCCL runs it, and NCCL refuses two ranks on one GPU: that, or nothing, is raised
        assert not g["raised"] or "nccl" in g["raised"].lower(), got


def assert_invalid_setting_refused(name, value):
    """An invalid setting on one rank: it raises a ValueError naming it, the other raises too."""
    got = run_ranks(setup_worker, 2, [{}, {name: value}], timeout=180, env=ENV)
    assert "ValueError" in got[1]["raised"] and name in got[1]["raised"], got
    assert "rank 1 has an invalid" in got[0]["raised"], got


def graph_worker(rank, world, replays):
    torch.cuda.set_device(0)
    cfg = qcomm.QuantConfig(rs_bits=8, ag_bits=8, min_bytes=0)
    qcomm.set_config(cfg)
    numel = 10007
    static = torch.zeros(numel, device="cuda")
    dist.all_reduce(static)  # warm-up: sets up the transport outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(static)
    problems = []
    for i in range(replays):
        xs = inputs(world, numel, torch.float32, 1000 + i)
        static.copy_(xs[rank].cuda())
        graph.replay()
        got = static.cpu()
        want = ref_allreduce(xs).out
        if not torch.equal(got, want):
            problems.append(
                f"replay {i}: differs from the reference at {int((got != want).sum())} elements"
            )
            break
    # the group still runs eager calls after the replays (the epochs stayed in step)
    problems += case(rank, world, 8, 8, torch.float32, 5000, 77)
    return problems
