"""Quantized reduce-scatter and all-gather, ranks in one process (tests/inproc.py): every rank's
result equals the reference model's (qcomm/reference.py) bit for bit and lies within its bound of
the float64 exact value; the all-gather is bit-identical on every rank, the owner's slot included;
the reduce-scatter leaves its input unchanged; ineligible calls pass through exactly."""

import inproc
import pytest
import torch
import torch.distributed as dist

import qcomm
from qcomm import reference as ref

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ALGOS = ["two_step", "ring", "semi_ring"]
# shard sizes: one element, under a group, a group and one, neither a multiple of the group nor
# of any world size
SHARDS = [1, 31, 129, 1000]


def _cfg(**kw):
    base = dict(min_bytes=0, reduce_scatter=True, all_gather=True, microshards=3, tune=False)
    base.update(kw)
    return qcomm.QuantConfig(**base)


def _inputs(world, numel, dtype, seed):
    xs = []
    for r in range(world):
        g = torch.Generator().manual_seed(seed * 100 + r)
        xs.append((torch.randn(numel, generator=g) * (1 + r)).to(dtype))
    return xs


def _same_bits(a, b):
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _check_rs(g, xs, algo, op, factor=None, in_place=False, rs_bits=8):
    world = g.world
    outs = g.reduce_scatter(xs, op=op, factor=factor, in_place=in_place)
    want = ref.reduce_scatter(xs, algo, rs_bits, op=op, factor=factor)
    for r in range(world):
        name = f"W={world} {algo} {xs[0].dtype} n={xs[0].numel()} {op}({factor}) rank {r}"
        assert _same_bits(outs[r], want[r].out), name + ": differs from the reference"
        err = (outs[r].double() - want[r].exact).abs()
        assert bool((err <= want[r].bound).all()), name + ": outside the bound"


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("algo", ALGOS)
def test_reduce_scatter_matches_the_reference(world, algo):
    g = inproc.group(world)
    g.set_config(_cfg(algorithm=algo))
    before = g.stats()["by_collective"]["reduce_scatter"]["quantized_calls"]
    calls = 0
    for dtype in DTYPES:
        for i, n in enumerate(SHARDS):
            xs = _inputs(world, n * world, dtype, seed=i)
            op = ["sum", "avg", "premul"][i % 3]
            _check_rs(g, xs, algo, op, factor=1 / 3 if op == "premul" else None)
            calls += 1
    after = g.stats()["by_collective"]["reduce_scatter"]["quantized_calls"]
    assert after == before + calls  # every call was quantized


@pytest.mark.parametrize("world", [2, 3])
def test_reduce_scatter_ops_and_in_place(world):
    g = inproc.group(world)
    g.set_config(_cfg(algorithm="two_step", microshards=1))
    xs = _inputs(world, 300 * world, torch.bfloat16, seed=7)
    for op, factor in [("sum", None), ("avg", None), ("premul", 0.5), ("premul", 0.25)]:
        _check_rs(g, xs, "two_step", op, factor)
        _check_rs(g, xs, "two_step", op, factor, in_place=True)
    # the factor is applied in fp32 to the sum, never narrowed: a power-of-two factor of bf16
    # inputs does not zero the result (pytorch #190745)
    out = g.reduce_scatter(xs, op="premul", factor=0.5)
    assert all(bool((o != 0).any()) for o in out)


def test_reduce_scatter_4_bit_and_symmetric():
    g = inproc.group(2)
    xs = _inputs(2, 2 * 1000, torch.float32, seed=3)
    for algo in ALGOS:
        g.set_config(_cfg(algorithm=algo, rs_bits=4, rotate=False, symmetric=True))
        outs = g.reduce_scatter(xs)
        want = ref.reduce_scatter(xs, algo, 4, symmetric=True, rotate=False)
        assert all(_same_bits(o, w.out) for o, w in zip(outs, want)), algo


def test_reduce_scatter_stochastic_rounding_follows_the_call_number():
    g = inproc.group(3)
    g.set_config(_cfg(algorithm="ring", stochastic_rounding=True))
    xs = _inputs(3, 3 * 257, torch.float32, seed=5)
    seq = g.stats()["next_call_seq"]
    outs = g.reduce_scatter(xs)
    want = ref.reduce_scatter(xs, "ring", 8, stochastic_seq=seq)
    assert all(_same_bits(o, w.out) for o, w in zip(outs, want))
    nearest = ref.reduce_scatter(xs, "ring", 8)
    assert not all(_same_bits(o, w.out) for o, w in zip(outs, nearest))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_all_gather_is_the_same_on_every_rank(world):
    g = inproc.group(world)
    g.set_config(_cfg(stochastic_rounding=True))  # never used by an all-gather
    for dtype in DTYPES:
        for i, n in enumerate(SHARDS):
            xs = _inputs(world, n, dtype, seed=10 + i)
            for in_place in (False, True):
                outs = g.all_gather(xs, in_place=in_place)
                want = ref.all_gather(xs, 8)
                name = f"W={world} {dtype} n={n} in_place={in_place}"
                for r in range(world):
                    assert _same_bits(outs[r], want.out), f"{name} rank {r}"
                err = (outs[0].double() - want.exact).abs()
                assert bool((err <= want.bound).all()), name
    # the owner's slot is the decoded bytes it sent, not its input (DESIGN invariant 1)
    xs = _inputs(world, 1000, torch.float32, seed=1)
    outs = g.all_gather(xs)
    assert not torch.equal(outs[0][:1000], xs[0])


def test_all_gather_4_bit():
    g = inproc.group(2)
    g.set_config(_cfg(ag_bits=4, rotate=False))
    xs = _inputs(2, 500, torch.bfloat16, seed=2)
    outs = g.all_gather(xs)
    want = ref.all_gather(xs, 4, rotate=False)
    assert _same_bits(outs[0], want.out) and _same_bits(outs[1], want.out)


def _gloo_rs(g, xs, op):
    """Gloo's own reduce_scatter_tensor of xs (the pass-through's expectation)."""
    outs = [torch.empty(xs[0].numel() // g.world, dtype=xs[0].dtype) for _ in xs]
    ins = [x.clone() for x in xs]

    def run(r):
        o = dist.ReduceScatterOptions()
        o.reduceOp = inproc.reduce_op(op)
        g.inner[r]._reduce_scatter_base(outs[r], ins[r], o).wait()

    g.on_all(run)
    return outs


def test_ineligible_calls_pass_through_exactly():
    g = inproc.group(2)
    g.set_config(_cfg())
    before = g.stats()["by_collective"]
    # MAX is not linear: Gloo's result, bit for bit
    xs = _inputs(2, 2 * 300, torch.float32, seed=4)
    assert all(
        torch.equal(a, b) for a, b in zip(g.reduce_scatter(xs, op="max"), _gloo_rs(g, xs, "max"))
    )
    # integers, uint8 views (FSDP2's mixed-dtype all-gather) and fp64: exact
    for dtype in (torch.int64, torch.uint8, torch.float64):
        xs = [(torch.arange(300) * (r + 3) % 200).to(dtype) for r in range(2)]
        outs = g.all_gather(xs)
        assert all(torch.equal(o, torch.cat(xs)) for o in outs), dtype
    after = g.stats()["by_collective"]
    assert after["reduce_scatter"]["quantized_calls"] == before["reduce_scatter"]["quantized_calls"]
    assert after["all_gather"]["quantized_calls"] == before["all_gather"]["quantized_calls"]
    assert after["all_gather"]["passthrough_calls"] == before["all_gather"]["passthrough_calls"] + 3


def test_off_by_default_bit_identical_to_gloo():
    g = inproc.group(3)
    g.set_config(qcomm.QuantConfig(min_bytes=0, tune=False))
    xs = _inputs(3, 3 * 1000, torch.float32, seed=8)
    for op in ("sum", "avg"):
        ours, gloo = g.reduce_scatter(xs, op=op), _gloo_rs(g, xs, op)
        assert all(_same_bits(a, b) for a, b in zip(ours, gloo)), op
    outs = g.all_gather([x[:1000] for x in xs])
    assert all(torch.equal(o, torch.cat([x[:1000] for x in xs])) for o in outs)


def test_premul_passes_through_with_torch_semantics_when_rs_is_on():
    # Gloo refuses PREMUL_SUM; on a group that quantizes reduce-scatters, one below min_bytes
    # still means sum of (factor x input), as NCCL defines it
    g = inproc.group(2)
    g.set_config(_cfg(min_bytes=1 << 30))
    xs = _inputs(2, 2 * 64, torch.float32, seed=9)
    outs = g.reduce_scatter(xs, op="premul", factor=0.5)
    exact = xs[0] * 0.5 + xs[1] * 0.5
    assert torch.equal(torch.cat(outs), exact)


def test_plan_gates_and_geometry():
    b = inproc.group(3).backends[0]
    big = torch.zeros(3 * 1000)
    R = dist.ReduceOp
    b.set_config(_cfg().encoded())
    p = b.plan_sharded(1, big, big[:1000], R.SUM)
    assert p["quantize"] and p["chunk_elems"] == 1000 and p["collective"] == "reduce_scatter"
    p = b.plan_sharded(1, big, big[:1000], dist._make_nccl_premul_sum(0.5))
    assert p["quantize"] and p["premul_factor"] == 0.5
    cases = [
        (_cfg(reduce_scatter=False), 1, R.SUM, "reduce_scatter quantization is off"),
        (_cfg(all_gather=False), 2, R.SUM, "all_gather quantization is off"),
        (_cfg(rs_bits=None), 1, R.SUM, "the reduce phase is none"),
        (_cfg(ag_bits=None), 2, R.SUM, "the gather phase is none"),
        (_cfg(), 1, R.MAX, "op is not SUM, AVG or PREMUL_SUM"),
        (_cfg(min_bytes=1 << 20), 1, R.SUM, "message below min_bytes"),
    ]
    for cfg, coll, op, reason in cases:
        b.set_config(cfg.encoded())
        p = b.plan_sharded(coll, big, big[:1000], op)
        assert not p["quantize"] and reason in p["reason"], (reason, p["reason"])
    b.set_config(_cfg().encoded())
    p = b.plan_sharded(1, big, big[:999], R.SUM)
    assert not p["quantize"] and p["reason"].startswith("output is not 1/W of the input")
    p = b.plan_sharded(1, big, big[:1000], dist._make_nccl_premul_sum(torch.tensor(0.5)))
    assert not p["quantize"] and p["reason"] == "PREMUL_SUM with a tensor factor"
    p = b.plan_sharded(2, big, big[:1000], R.SUM)
    assert p["quantize"] and not p["stochastic_rounding"]
    # rotation: unset, on where the call's own codec has 4 bits; each shard of 1000 padded to
    # whole groups of 128 (1024)
    for cfg, coll, rotated in [
        (_cfg(rs_bits=4), 1, True),
        (_cfg(rs_bits=4), 2, False),
        (_cfg(ag_bits=4), 2, True),
        (_cfg(ag_bits=4), 1, False),
        (_cfg(rotate=True), 1, True),
        (_cfg(rotate=True), 2, True),
        (_cfg(rs_bits=4, rotate=False), 1, False),
    ]:
        b.set_config(cfg.encoded())
        p = b.plan_sharded(coll, big, big[:1000], R.SUM)
        assert p["quantize"] and p["rotate"] == rotated, (cfg, coll, p)
        assert p["chunk_elems"] == (1024 if rotated else 1000)
    b.set_config(_cfg().encoded())


def test_shadow_mode_records_each_collective_apart():
    g = inproc.group(2)
    g.set_config(_cfg(shadow=1))
    for b in g.backends:
        b.reset_stats()
    xs = _inputs(2, 2 * 1000, torch.float32, seed=11)
    rs = g.reduce_scatter(xs, op="avg")
    ag = g.all_gather([x[:1000] for x in xs], in_place=True)
    # the caller still gets the quantized result, bit for bit as without shadowing
    assert all(_same_bits(o, w.out) for o, w in zip(rs, ref.reduce_scatter(xs, op="avg")))
    assert _same_bits(ag[0], ref.all_gather([x[:1000] for x in xs]).out)
    shadow = g.stats()["shadow"]
    assert set(shadow) == {
        "reduce_scatter float32 2 KiB to 4 KiB",
        "all_gather float32 4 KiB to 8 KiB",
    }
    for key, e in shadow.items():
        assert e["calls"] == 1 and 0 < e["rel_l2_max"] < 0.01, (key, e)
    g.set_config(_cfg())


def test_non_contiguous_tensors_get_their_results():
    g = inproc.group(2)
    g.set_config(_cfg(algorithm="two_step"))
    xs = _inputs(2, 2 * 300, torch.bfloat16, seed=12)
    want = ref.reduce_scatter(xs, "two_step", 8)
    outs = [torch.zeros(600, dtype=torch.bfloat16) for _ in range(2)]
    ins = [torch.stack([x, x]).t().reshape(-1)[::2].clone() for x in xs]  # equal to xs
    strided_ins = [torch.stack([x, torch.zeros_like(x)], 1).reshape(-1)[::2] for x in xs]
    assert not strided_ins[0].is_contiguous() and torch.equal(strided_ins[0], ins[0])

    def run(r):
        o = dist.ReduceScatterOptions()
        g.backends[r]._reduce_scatter_base(outs[r][::2], strided_ins[r], o).wait()

    g.on_all(run)
    for r in range(2):
        assert _same_bits(outs[r][::2], want[r].out) and bool((outs[r][1::2] == 0).all())
    # all-gather into a strided output
    ag_out = [torch.zeros(1200) for _ in range(2)]
    shards = [x[:300].float() for x in xs]

    def run_ag(r):
        o = torch._C._distributed_c10d.AllgatherOptions()
        g.backends[r]._allgather_base(ag_out[r][::2], shards[r], o).wait()

    g.on_all(run_ag)
    want = ref.all_gather(shards, 8).out
    assert all(_same_bits(o[::2], want) for o in ag_out)


def test_non_finite_stays_non_finite():
    g = inproc.group(2)
    for algo in ALGOS:
        g.set_config(_cfg(algorithm=algo))
        xs = _inputs(2, 2 * 1000, torch.bfloat16, seed=13)
        xs[0][1500] = float("nan")  # rank 1's shard, from rank 0's input
        xs[1][10] = float("inf")  # rank 0's shard
        outs = g.reduce_scatter(xs)
        assert not bool(torch.isfinite(outs[1][500])) and not bool(torch.isfinite(outs[0][10]))
        assert bool(torch.isfinite(outs[0][500:]).all()), algo  # other groups stay finite
    shards = [x[:1000] for x in _inputs(2, 1000, torch.float32, seed=14)]
    shards[1][7] = float("-inf")
    for o in g.all_gather(shards):
        assert not bool(torch.isfinite(o[1007])) and bool(torch.isfinite(o[:1000]).all())


# ---- rotation (QuantConfig.rotate): each shard padded to whole groups, rotated, rotated back ----

# shard sizes: under a group, a group and one, neither a multiple of the group nor of any world
ROT_SHARDS = [31, 129, 300]


def _check_rotated_rs(g, xs, algo, op, factor, rs_bits, rotate):
    outs = g.reduce_scatter(xs, op=op, factor=factor)
    want = ref.reduce_scatter(xs, algo, rs_bits, op=op, factor=factor, rotate=rotate)
    for r in range(g.world):
        name = f"W={g.world} {algo} {rs_bits} bits {xs[0].dtype} n={xs[0].numel()} {op} rank {r}"
        assert _same_bits(outs[r], want[r].out), name + ": differs from the reference"
        err = (outs[r].double() - want[r].exact).abs()
        assert bool((err <= want[r].bound).all()), name + ": outside the bound"


@pytest.mark.parametrize("world", [2, 3, 4])
def test_rotated_reduce_scatter_matches_the_reference(world):
    g = inproc.group(world)
    before = g.stats()["by_collective"]["reduce_scatter"]["quantized_calls"]
    calls = 0
    # 4 bits with rotate unset (on), 8 bits with rotate=True
    for rs_bits, rotate in ((4, None), (8, True)):
        for a, algo in enumerate(ALGOS):
            g.set_config(_cfg(algorithm=algo, rs_bits=rs_bits, rotate=rotate, microshards=2))
            for i, n in enumerate(ROT_SHARDS):
                dtype = (torch.float32, torch.bfloat16)[(i + a) % 2]
                xs = _inputs(world, n * world, dtype, seed=20 + i)
                op = ["sum", "avg", "premul"][(i + a) % 3]
                _check_rotated_rs(g, xs, algo, op, 0.25 if op == "premul" else None, rs_bits, True)
                calls += 1
    after = g.stats()["by_collective"]["reduce_scatter"]["quantized_calls"]
    assert after == before + calls  # every call was quantized, none passed through


def test_rotated_reduce_scatter_in_place_and_stochastic():
    g = inproc.group(3)
    g.set_config(_cfg(algorithm="two_step", rs_bits=4, stochastic_rounding=True, symmetric=True))
    xs = _inputs(3, 3 * 200, torch.bfloat16, seed=30)
    seq = g.stats()["next_call_seq"]
    outs = g.reduce_scatter(xs, op="avg", in_place=True)
    want = ref.reduce_scatter(xs, "two_step", 4, symmetric=True, op="avg", stochastic_seq=seq)
    assert all(_same_bits(o, w.out) for o, w in zip(outs, want))
    assert all(bool(((o.double() - w.exact).abs() <= w.bound).all()) for o, w in zip(outs, want))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_rotated_all_gather_is_the_same_on_every_rank(world):
    g = inproc.group(world)
    for ag_bits, rotate in ((4, None), (8, True)):
        g.set_config(_cfg(ag_bits=ag_bits, rotate=rotate))
        for i, n in enumerate(ROT_SHARDS):
            dtype = (torch.float32, torch.bfloat16)[i % 2]
            xs = _inputs(world, n, dtype, seed=40 + i)
            outs = g.all_gather(xs, in_place=bool(i % 2))
            want = ref.all_gather(xs, ag_bits, rotate=True)
            name = f"W={world} {ag_bits} bits {dtype} n={n}"
            for r in range(world):
                assert _same_bits(outs[r], want.out), f"{name} rank {r}"
            err = (outs[0].double() - want.exact).abs()
            assert bool((err <= want.bound).all()), name


def _heavy_tailed(world, n, seed):
    """Student-t (3 degrees of freedom) per rank: most groups hold an element many times their
    typical size, which sets the step of an unrotated 4-bit group."""
    gen = torch.Generator().manual_seed(seed)
    xs = []
    for _ in range(world):
        z = torch.randn(n, generator=gen)
        chi2 = torch.randn(3, n, generator=gen).square().sum(0)  # 3 degrees of freedom
        xs.append(z / (chi2 / 3).sqrt())
    return xs


def test_rotation_lowers_the_4_bit_reduce_scatter_error_on_heavy_tails():
    # the reference model and the backend (equal bit for bit) on 4 ranks: the relative L2 error of
    # a 4-bit reduce-scatter of heavy-tailed inputs, rotated against unrotated
    world, n = 4, 4 * 1000
    xs = _heavy_tailed(world, n, seed=50)
    exact = torch.stack([x.double() for x in xs]).sum(0)

    def rel_l2(outs):
        got = torch.cat([o.double() for o in outs])
        return float((got - exact).norm() / exact.norm())

    plain = rel_l2([r.out for r in ref.reduce_scatter(xs, "two_step", 4, rotate=False)])
    rotated = rel_l2([r.out for r in ref.reduce_scatter(xs, "two_step", 4, rotate=True)])
    g = inproc.group(world)
    g.set_config(_cfg(algorithm="two_step", rs_bits=4))  # rotate unset: on at 4 bits
    assert rel_l2(g.reduce_scatter(xs)) == rotated
    # measured: 0.58 here (seed 50), 0.51 to 0.59 over seeds 50-53 at worlds 2 and 4
    assert rotated < 0.7 * plain, (rotated, plain)
