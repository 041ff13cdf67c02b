"""Issue 48: the coalesced forms quantized on the one-call path (csrc/backend/backend.cpp, the
coalesced entries): allreduce_coalesced, reduce_scatter_tensor_coalesced and
allgather_into_tensor_coalesced, which torch's functional collectives (DTensor's redistribute,
tensor parallelism, torch.compile) use even for one tensor. Several tensors of one dtype share
one packed message (one agreement, one schedule); tensors that differ pass through, counted under
their collective, with the reason in the plan. Results within the 8-bit codec's bound of the
exact float64 result; passed-through calls bit for bit Gloo's."""

import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import qcomm

from dist_util import run_ranks

CFG = qcomm.QuantConfig(min_bytes=0, reduce_scatter=True, all_gather=True, tune=False)
N = 4096  # elements per shard


def _x(rank, n, seed):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed * 10 + rank))


def _error(got, exact, world):
    """'' when |got - exact| <= 2^-6 * max|exact| * W (8-bit groups: each rank's encode errs by at
    most half a step of 2 max|x| / 255, and W of them add up), else what is wrong."""
    got, exact = got.double().flatten(), exact.double().flatten()
    if got.shape != exact.shape:
        return f"shape {tuple(got.shape)}, expected {tuple(exact.shape)}"
    err = float((got - exact).abs().max())
    bound = 2.0**-6 * float(exact.abs().max()) * world
    return "" if err <= bound else f"max error {err:.3g} > bound {bound:.3g}"


def _counts():
    by = qcomm.stats()["by_collective"]
    return {k: by[k]["quantized_calls"] for k in ("all_reduce", "reduce_scatter", "all_gather")}


def _delta(before):
    now = _counts()
    return {k: now[k] - before[k] for k in now}


def _funcol_worker(rank, world):
    """funcol's single and coalesced all-gather and reduce-scatter, several tensors of several
    sizes; allreduce_coalesced; each quantized once per call, within the bound."""
    group = dist.group.WORLD
    problems = []
    xs = [[_x(r, N * k, seed=k) for r in range(world)] for k in (1, 2, 3)]
    before = _counts()
    got = funcol.all_gather_tensor(xs[0][rank], 0, group).wait()
    problems.append(_error(got, torch.cat(xs[0]), world))
    got = funcol.all_gather_into_tensor_coalesced([x[rank] for x in xs], group)
    for k, g in enumerate(got):
        problems.append(_error(funcol.wait_tensor(g), torch.cat(xs[k]), world))
    full = [[_x(r, world * N * k, seed=10 + k) for r in range(world)] for k in (1, 2, 3)]

    def own(k):
        exact = torch.stack([f.double() for f in full[k]]).sum(0)
        return exact.chunk(world)[rank]

    got = funcol.reduce_scatter_tensor(full[0][rank], "sum", 0, group).wait()
    problems.append(_error(got, own(0), world))
    got = funcol.reduce_scatter_tensor_coalesced([f[rank] for f in full], "sum", [0] * 3, group)
    for k, g in enumerate(got):
        problems.append(_error(funcol.wait_tensor(g), own(k), world))
    ts = [x[rank].clone() for x in xs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # all_reduce_coalesced is deprecated in torch
        dist.all_reduce_coalesced(ts)
    for k, t in enumerate(ts):
        problems.append(_error(t, torch.stack([x.double() for x in xs[k]]).sum(0), world))
    return [p for p in problems if p], _delta(before)


def test_functional_and_coalesced_collectives_quantize_within_the_bound():
    for rank, (problems, delta) in enumerate(run_ranks(_funcol_worker, 2, pg_options=CFG)):
        assert problems == [], (rank, problems)
        # one quantized call per call: AG 1 + 1 coalesced, RS 1 + 1 coalesced, AR 1 coalesced
        assert delta == {"all_reduce": 1, "reduce_scatter": 2, "all_gather": 2}, (rank, delta)


def _unlike_worker(rank, world):
    """Coalesced tensors of two dtypes pass through, and qcomm.plan says why: Gloo's exact sums
    (two ranks: one rounding of the exact sum, fp32 and bf16 alike), counted under the
    collective."""
    a = _x(rank, world * N, 1)
    b = _x(rank, world * N, 2).to(torch.bfloat16)
    before = qcomm.stats()["by_collective"]["reduce_scatter"]
    got = funcol.reduce_scatter_tensor_coalesced([a, b], "sum", [0, 0], dist.group.WORLD)
    got = [funcol.wait_tensor(g) for g in got]
    after = qcomm.stats()["by_collective"]["reduce_scatter"]
    same = []
    for k, (g, dtype) in enumerate(zip(got, (torch.float32, torch.bfloat16))):
        inputs = [_x(r, world * N, k + 1).to(dtype) for r in range(world)]
        exact = torch.stack([t.double() for t in inputs]).sum(0).chunk(world)[rank]
        same.append(torch.equal(g, exact.to(dtype)))
    unlike = qcomm.plan([a, b], collective="reduce_scatter")
    alike = qcomm.plan([a, a.clone()], collective="reduce_scatter")
    return (
        same,
        after["passthrough_calls"] - before["passthrough_calls"],
        after["quantized_calls"] - before["quantized_calls"],
        (unlike["quantize"], "differ" in unlike["reason"], alike["quantize"]),
    )


def test_unlike_coalesced_tensors_pass_through_exactly_and_counted():
    for rank, (same, passed, quantized, plans) in enumerate(
        run_ranks(_unlike_worker, 2, pg_options=CFG)
    ):
        assert same == [True, True], (rank, same)
        assert (passed, quantized) == (1, 0), (rank, passed, quantized)
        # qcomm.plan answers for the coalesced form: why it passes through, and that alike
        # tensors quantize
        assert plans == (False, True, True), (rank, plans)


def _dtensor_worker(rank, world):
    """DTensor's redistribute: Shard(0) -> Replicate (an all-gather), Partial -> Shard(0) (a
    reduce-scatter) and Partial -> Replicate (an allreduce), each quantized, within the bound."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    full = _x(0, world * N, 7)  # the same on every rank
    problems = []
    before = _counts()
    d = distribute_tensor(full, mesh, [Shard(0)])
    problems.append(_error(d.redistribute(mesh, [Replicate()]).to_local(), full, world))
    locals_ = [_x(r, world * N, 8) for r in range(world)]
    exact = torch.stack([t.double() for t in locals_]).sum(0)
    p = DTensor.from_local(locals_[rank], mesh, [Partial()])
    problems.append(
        _error(p.redistribute(mesh, [Shard(0)]).to_local(), exact.chunk(world)[rank], 2)
    )
    p = DTensor.from_local(locals_[rank], mesh, [Partial()])
    problems.append(_error(p.redistribute(mesh, [Replicate()]).to_local(), exact, world))
    # uneven shards (DTensor pads the last shard to the others' length, then unpads)
    odd = _x(0, world * N + 3, 9).view(-1, 1)
    d = distribute_tensor(odd, mesh, [Shard(0)])
    problems.append(_error(d.redistribute(mesh, [Replicate()]).to_local(), odd, world))
    locals_ = [_x(r, world * N + 3, 10).view(-1, 1) for r in range(world)]
    exact = torch.stack([t.double() for t in locals_]).sum(0)
    p = DTensor.from_local(locals_[rank], mesh, [Partial()])
    mine = torch.chunk(exact, world)[rank]  # DTensor's Shard(0): torch.chunk's pieces
    problems.append(_error(p.redistribute(mesh, [Shard(0)]).to_local(), mine, world))
    return [x for x in problems if x], _delta(before)


def test_dtensor_redistribute_quantizes():
    for rank, (problems, delta) in enumerate(run_ranks(_dtensor_worker, 2, pg_options=CFG)):
        assert problems == [], (rank, problems)
        assert delta["all_gather"] >= 2 and delta["reduce_scatter"] >= 2, (rank, delta)
        assert delta["all_reduce"] >= 1, (rank, delta)


def _list_worker(rank, world):
    """The list forms with several tensors per rank, through the ProcessGroup (torch's Python
    collectives take one): allgather(outputs[k][W], inputs[k]) and reduce_scatter(outputs[k],
    inputs[k][W]), two tensors of different sizes, each one packed quantized call; then
    allreduce's pass-throughs (a MAX, and Gloo's form of several tensors) counted under
    all_reduce."""
    pg = dist.group.WORLD
    problems = []
    sizes = (N, 3 * N)
    before = qcomm.stats()["by_collective"]
    ins = [_x(rank, n, 20 + k) for k, n in enumerate(sizes)]
    outs = [[torch.empty(n) for _ in range(world)] for n in sizes]
    pg.allgather(outs, ins).wait()
    for k, n in enumerate(sizes):
        for r in range(world):
            problems.append(_error(outs[k][r], _x(r, n, 20 + k), world))
    lists = [[_x(rank, n, 30 + 3 * k + r) for r in range(world)] for k, n in enumerate(sizes)]
    outs = [torch.empty(n) for n in sizes]
    pg.reduce_scatter(outs, lists).wait()
    for k, n in enumerate(sizes):
        exact = torch.stack([_x(r, n, 30 + 3 * k + rank).double() for r in range(world)]).sum(0)
        problems.append(_error(outs[k], exact, world))
    mid = qcomm.stats()["by_collective"]
    t = _x(rank, N, 40)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    pair = [_x(rank, N, 41), _x(rank, N, 42)]
    pg.allreduce(pair).wait()
    after = qcomm.stats()["by_collective"]

    def d(a, b, c, k):
        return b[c][k] - a[c][k]

    counts = {
        "ag_q": d(before, mid, "all_gather", "quantized_calls"),
        "rs_q": d(before, mid, "reduce_scatter", "quantized_calls"),
        "ar_pass": d(mid, after, "all_reduce", "passthrough_calls"),
        "ar_q": d(mid, after, "all_reduce", "quantized_calls"),
    }
    exact_max = torch.stack([_x(r, N, 40) for r in range(world)]).max(0).values
    problems.append("" if torch.equal(t, exact_max) else "MAX allreduce not exact")
    return [p for p in problems if p], counts


def test_list_forms_with_several_tensors_quantize_and_every_call_is_counted():
    for rank, (problems, counts) in enumerate(run_ranks(_list_worker, 2, pg_options=CFG)):
        assert problems == [], (rank, problems)
        assert counts == {"ag_q": 1, "rs_q": 1, "ar_pass": 2, "ar_q": 0}, (rank, counts)
