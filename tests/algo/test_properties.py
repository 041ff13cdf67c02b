"""Property-based tests (hypothesis) of the codec and of the three algorithms against
qcomm/reference.py, over random shapes, values, group sizes, bit widths and world sizes."""

import math

import inproc
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qcomm
from qcomm import reference as ref

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def _same_bits(a, b):
    na, nb = torch.isnan(a), torch.isnan(b)
    return torch.equal(na, nb) and torch.equal(a[~na], b[~nb])


@st.composite
def tensors(draw, max_n=3000, dtype=None):
    n = draw(st.integers(1, max_n))
    dtype = dtype or DTYPES[draw(st.sampled_from(sorted(DTYPES)))]
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    kind = draw(st.sampled_from(["normal", "heavy", "outliers", "zeros", "constant", "scaled"]))
    x = torch.randn(n, generator=g)
    if kind == "heavy":
        x = torch.distributions.StudentT(3.0).sample((n,)) if n else x
        x = x.nan_to_num(0.0)
    elif kind == "outliers":
        idx = torch.randint(0, n, (max(1, n // 100),), generator=g)
        x[idx] *= 30.0
    elif kind == "zeros":
        x = x * (torch.rand(n, generator=g) < 0.05)
    elif kind == "constant":
        x = torch.full((n,), float(x[0]))
    else:
        exp = draw(st.integers(-30, 30))
        x = x * 10.0**exp
    fmax = torch.finfo(dtype).max
    return x.clamp(-fmax / 8, fmax / 8).to(dtype)


@settings(max_examples=150, **SETTINGS)
@given(
    x=tensors(),
    bits=st.sampled_from([4, 8]),
    sym=st.booleans(),
    log_g=st.integers(5, 10),
)
def test_codec_matches_reference(x, bits, sym, log_g):
    g = 2**log_g
    c = ref.Codec(bits, g, sym)
    b = qcomm.codec.encode(x, bits, g, sym)
    assert torch.equal(b, ref.encode_bytes(x, c))
    y = qcomm.codec.decode(b, x.numel(), bits, g, sym)
    y_ref, bound = ref.roundtrip(x, c)
    assert _same_bits(y, y_ref)
    assert bool(((y.double() - x.double()).abs() <= bound).all())


@settings(max_examples=200, **SETTINGS)
@given(
    world=st.integers(2, 6),
    n=st.integers(1, 5000),
    dtype=st.sampled_from(sorted(DTYPES)),
    algo=st.sampled_from(["two_step", "ring", "semi_ring"]),
    bits=st.sampled_from([(8, 8), (4, 8), (4, 4), (None, 8), (8, None), (None, 4)]),
    log_g=st.integers(5, 10),
    sym=st.booleans(),
    avg=st.booleans(),
    shards=st.integers(1, 7),
    rotate=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_algorithms_match_reference(
    world, n, dtype, algo, bits, log_g, sym, avg, shards, rotate, seed
):
    g = inproc.group(world)
    cfg = qcomm.QuantConfig(
        algorithm=algo,
        rs_bits=bits[0],
        ag_bits=bits[1],
        group_size=2**log_g,
        symmetric=sym,
        min_bytes=0,
        microshards=shards,
        rotate=rotate,
    )
    g.set_config(cfg)
    gen = torch.Generator().manual_seed(seed)
    scales = [10.0 ** int(torch.randint(-3, 4, (1,), generator=gen)) for _ in range(world)]
    xs = [(torch.randn(n, generator=gen) * s).to(DTYPES[dtype]) for s in scales]
    before = g.stats()["quantized_calls"]
    outs = g.allreduce(xs, "avg" if avg else "sum")
    assert g.stats()["quantized_calls"] == before + 1
    r = ref.allreduce(xs, algo, bits[0], bits[1], 2**log_g, sym, average=avg, rotate=rotate)
    for o in outs:
        assert _same_bits(o, outs[0]), "ranks disagree"
    assert _same_bits(outs[0], r.out), "differs from the reference model"
    err = (outs[0].double() - r.exact).abs()
    assert bool((err <= r.bound).all()), f"max err/bound {float((err / r.bound).max())}"


@pytest.mark.parametrize("world", [2, 5])
def test_inproc_harness_can_fail(world):
    # the harness really compares: a wrong expectation is caught
    g = inproc.group(world)
    g.set_config(qcomm.QuantConfig(min_bytes=0))
    xs = [torch.ones(1000) * (r + 1) for r in range(world)]
    outs = g.allreduce(xs)
    want = world * (world + 1) / 2
    assert all(math.isclose(float(o[0]), want, rel_tol=1e-2) for o in outs)
    assert not math.isclose(float(outs[0][0]), want + 1, rel_tol=1e-3)
