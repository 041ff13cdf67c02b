"""QuantConfig.stochastic_rounding: codes rounded down after adding hashed uniform noise. The
result still matches the reference bit for bit and is identical on every rank, and the error is
unbiased: its mean over many calls tends to zero, which round-to-nearest's does not."""

import math

import inproc
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qcomm
from qcomm import _testing
from qcomm import reference as ref


def test_noise_matches_reference_and_is_uniform():
    assert _testing.noise_salt(7, 3, 1) == ref.noise_salt(7, 3, 1)
    u = ref.noise(ref.noise_salt(1, 0, 0), 0, 200000).double()
    assert 0 <= float(u.min()) and float(u.max()) < 1
    # mean 1/2 and variance 1/12 within 5 standard errors
    assert abs(float(u.mean()) - 0.5) < 5 * math.sqrt(1 / 12 / u.numel())
    assert abs(float(u.var()) - 1 / 12) < 5 * math.sqrt(1 / 180 / u.numel())


@pytest.mark.parametrize("bits,sym", [(4, True), (4, False), (8, True), (8, False)])
def test_codec_stochastic_matches_reference(bits, sym):
    x = torch.randn(3000, generator=torch.Generator().manual_seed(bits))
    salt = ref.noise_salt(11, 2, 0)
    b = qcomm.codec.encode(x, bits, 64, sym, noise_salt=salt, noise_base=1234)
    c = ref.Codec(bits, 64, sym)
    assert torch.equal(b, ref.encode_bytes(x, c, (salt, 1234)))
    y = qcomm.codec.decode(b, x.numel(), bits, 64, sym)
    y_ref, bound = ref.roundtrip(x, c, (salt, 1234))
    assert torch.equal(y, y_ref)
    assert bool(((y.double() - x.double()).abs() <= bound).all())


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(
    world=st.integers(2, 5),
    n=st.integers(1, 3000),
    algo=st.sampled_from(["two_step", "ring", "semi_ring"]),
    bits=st.sampled_from([(8, 8), (4, 8), (4, 4), (None, 4), (4, None)]),
    rotate=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_algorithms_stochastic_match_reference(world, n, algo, bits, rotate, seed):
    g = inproc.group(world)
    g.set_config(
        qcomm.QuantConfig(
            algorithm=algo, rs_bits=bits[0], ag_bits=bits[1], min_bytes=0, microshards=3,
            rotate=rotate, stochastic_rounding=True,
        )
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(n, generator=gen) for _ in range(world)]
    seq = g.stats()["next_call_seq"]
    outs = g.allreduce(xs)
    r = ref.allreduce(xs, algo, bits[0], bits[1], rotate=rotate, stochastic_seq=seq)
    assert all(torch.equal(o, outs[0]) for o in outs), "ranks disagree"
    assert torch.equal(outs[0], r.out)
    assert bool(((outs[0].double() - r.exact).abs() <= r.bound).all())


@pytest.mark.parametrize("algo", ["two_step", "ring"])
def test_stochastic_rounding_is_unbiased(algo):
    world, n, trials = 2, 2048, 300
    g = inproc.group(world)
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(n, generator=gen) for _ in range(world)]
    exact = torch.stack([x.double() for x in xs]).sum(0)
    ratio = {}
    for stochastic in (False, True):
        g.set_config(
            qcomm.QuantConfig(
                algorithm=algo, rs_bits=4, ag_bits=4, min_bytes=0,
                stochastic_rounding=stochastic,
            )
        )  # fmt: skip
        errs = torch.stack([g.allreduce(xs)[0].double() - exact for _ in range(trials)])
        single = float(errs.pow(2).mean().sqrt())  # RMS error of one call
        mean_err = float(errs.mean(0).pow(2).mean().sqrt())  # RMS of the per-element mean error
        ratio[stochastic] = mean_err / single
    # unbiased: the mean over T independent calls shrinks like 1/sqrt(T) (allow 3x that)
    assert ratio[True] < 3 / math.sqrt(trials), ratio
    # round to nearest is deterministic: averaging does nothing
    assert ratio[False] > 0.99, ratio
