"""Reduce-scatter and all-gather through torch.distributed on spawned ranks: async calls mixed
with allreduces and pass-through calls on one group give what each gives alone; the list forms
equal the tensor forms; mismatched calls raise on every rank naming the field, and the group stays
usable; the settings and config fields reach the plan."""

import torch
import torch.distributed as dist

import qcomm
from qcomm import reference as ref

from dist_util import run_ranks

CFG = qcomm.QuantConfig(min_bytes=0, reduce_scatter=True, all_gather=True, tune=False)


def _x(rank, n, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed * 10 + rank)
    return torch.randn(n, generator=g).to(dtype)


def _mixed_worker(rank, world):
    n = 1000
    problems = []
    if qcomm.get_config() != CFG:  # through the C++ config and back
        problems.append(f"get_config: {qcomm.get_config()}")
    p = qcomm.plan(torch.empty(world * n), collective="reduce_scatter")
    if not (p["quantize"] and p["chunk_elems"] == n and p["collective"] == "reduce_scatter"):
        problems.append(f"plan(reduce_scatter): {p}")
    p = qcomm.plan(torch.empty(n, dtype=torch.int64), collective="all_gather")
    if p["quantize"] or p["reason"] != "dtype is not fp32, fp16 or bf16":
        problems.append(f"plan(all_gather, int64): {p}")
    if qcomm.plan(torch.empty(n))["collective"] != "all_reduce":
        problems.append("plan() of an allreduce does not name it")
    # alone, one at a time
    rs_in, ag_in, ar_in = _x(rank, world * n, 1), _x(rank, n, 2), _x(rank, 4000, 3)
    rs_alone = torch.empty(n)
    dist.reduce_scatter_tensor(rs_alone, rs_in, op=dist.ReduceOp.AVG)
    ag_alone = torch.empty(world * n)
    dist.all_gather_into_tensor(ag_alone, ag_in)
    ar_alone = ar_in.clone()
    dist.all_reduce(ar_alone)
    # the same calls async and interleaved with pass-through calls, waited for at the end
    seq = qcomm.stats()["next_call_seq"]
    rs_out, ag_out, ar_out = torch.empty(n), torch.empty(world * n), ar_in.clone()
    b = torch.full((5,), float(rank))
    works = [
        dist.reduce_scatter_tensor(rs_out, rs_in, op=dist.ReduceOp.AVG, async_op=True),
        dist.broadcast(b, src=1, async_op=True),
        dist.all_gather_into_tensor(ag_out, ag_in, async_op=True),
        dist.all_reduce(ar_out, async_op=True),
    ]
    for w in works:
        w.wait()
    if qcomm.stats()["next_call_seq"] != seq + 3:
        problems.append("the three quantized calls did not each take a call number")
    for name, a, b_ in [
        ("rs", rs_out, rs_alone),
        ("ag", ag_out, ag_alone),
        ("ar", ar_out, ar_alone),
    ]:
        if not torch.equal(a, b_):
            problems.append(f"async {name} differs from the same call alone")
    if not torch.equal(b, torch.ones(5)):
        problems.append("the broadcast between them is wrong")
    # against the reference: every rank's inputs are known
    want = ref.reduce_scatter([_x(r, world * n, 1) for r in range(world)], op="avg")[rank].out
    if not torch.equal(rs_out, want):
        problems.append("reduce_scatter differs from the reference")
    if not torch.equal(ag_out, ref.all_gather([_x(r, n, 2) for r in range(world)]).out):
        problems.append("all_gather differs from the reference")
    # the list forms: the same bits as the tensor forms
    lo = torch.empty(n)
    dist.reduce_scatter(lo, list(rs_in.chunk(world)), op=dist.ReduceOp.AVG)
    if not torch.equal(lo, rs_alone):
        problems.append("reduce_scatter (list) differs from reduce_scatter_tensor")
    outs = [torch.empty(n) for _ in range(world)]
    dist.all_gather(outs, ag_in)
    if not torch.equal(torch.cat(outs), ag_alone):
        problems.append("all_gather (list) differs from all_gather_into_tensor")
    by = qcomm.stats()["by_collective"]
    if by["reduce_scatter"]["quantized_calls"] != 3 or by["all_gather"]["quantized_calls"] != 3:
        problems.append(f"by_collective counts: {by}")
    if by["all_reduce"]["quantized_calls"] != 2 or not by["reduce_scatter"]["compression"] > 3:
        problems.append(f"by_collective: {by}")
    return problems


def test_async_mixed_list_forms_and_stats():
    for rank, problems in enumerate(run_ranks(_mixed_worker, 3, pg_options=CFG)):
        assert problems == [], (rank, problems)


def _raises(fn):
    try:
        fn()
        return "no error"
    except RuntimeError as e:
        return str(e)


def _mismatch_worker(rank, world):
    n = 1000
    msgs = {}
    out = torch.empty(n)
    # rank 0 reduce-scatters, rank 1 allreduces a message of the same numel
    if rank == 0:
        msgs["collective"] = _raises(lambda: dist.reduce_scatter_tensor(out, torch.ones(2 * n)))
    else:
        msgs["collective"] = _raises(lambda: dist.all_reduce(torch.ones(2 * n)))
    f = [0.5, 0.25][rank]
    msgs["factor"] = _raises(
        lambda: dist.reduce_scatter_tensor(out, torch.ones(2 * n), op=dist._make_nccl_premul_sum(f))
    )
    m = [n, 2 * n][rank]
    msgs["shape"] = _raises(lambda: dist.all_gather_into_tensor(torch.empty(2 * m), torch.ones(m)))
    # still usable
    dist.reduce_scatter_tensor(out, torch.ones(2 * n))
    msgs["after"] = float(out.sum())
    return msgs


def test_mismatches_raise_on_every_rank_naming_the_field():
    results = run_ranks(_mismatch_worker, 2, pg_options=CFG)
    for msgs in results:
        assert (
            "rank 1 is in a quantized allreduce, rank 0 in a quantized reduce_scatter"
            in (msgs["collective"])
        ), msgs
        assert "op is PREMUL_SUM(0.5) on rank 0 but PREMUL_SUM(0.25) on rank 1" in msgs["factor"]
        assert "numel is 2000 on rank 0 but 4000 on rank 1" in msgs["shape"], msgs["shape"]
        assert msgs["after"] == 2000.0


def test_settings_and_config_fields():
    cfg = qcomm.config.from_env({"QCOMM_REDUCE_SCATTER": "1", "QCOMM_ALL_GATHER": "on"})
    assert cfg.reduce_scatter and cfg.all_gather
    assert not qcomm.QuantConfig().reduce_scatter and not qcomm.QuantConfig().all_gather
    c = qcomm.QuantConfig(reduce_scatter=True)
    assert c.encoded()["reduce_scatter"] is True and c.encoded()["all_gather"] is False
    assert c._timeout is None  # DeviceMesh's backend_override reads it


def _log_worker(rank, world):
    cfg = qcomm.QuantConfig(reduce_scatter=True, all_gather=True, tune=False)
    qcomm.set_config(cfg)
    for _ in range(2):
        dist.reduce_scatter_tensor(torch.empty(1 << 18), torch.ones(1 << 19))  # 2 MiB: quantized
        dist.reduce_scatter_tensor(torch.empty(8), torch.ones(16), op=dist.ReduceOp.MAX)
        dist.all_gather_into_tensor(torch.empty(1 << 19), torch.ones(1 << 18))
    return qcomm.stats()["by_collective"]["reduce_scatter"]["quantized_calls"]


def test_the_decision_log_names_the_collective(capfd):
    assert run_ranks(_log_worker, 2, env={"QCOMM_DEBUG": "INFO"}) == [2, 2]
    err = capfd.readouterr().err.splitlines()
    lines = [x for x in err if "INFO reduce_scatter" in x or "INFO all_gather" in x]
    joined = "\n".join(lines)
    assert (
        "[qcomm rank 0/2] INFO reduce_scatter_tensor of 2 MiB to 4 MiB (float32): quantized with "
        "two_step at 8 bits, groups of 128" in joined
    ), joined
    assert "of 64 B to 128 B (float32): passed through: op is not SUM, AVG or PREMUL_SUM" in joined
    assert (
        "INFO all_gather_into_tensor of 2 MiB to 4 MiB (float32): quantized with the gather "
        in (joined)
    )
    assert len(lines) == 3, lines  # once per collective, size class and decision; rank 0 only
