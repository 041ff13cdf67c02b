"""QuantConfig.rotate: the Hadamard rotation is exact to invert, matches the reference bit for bit,
and earns its place on outlier-channel data (the goal: at least 2x lower int4 error)."""

import inproc
import pytest
import torch

import qcomm
from qcomm import reference as ref


def _llm_like(world, rows=8, hidden=4096, outliers=(17, 507, 1234, 2048, 3001, 4000), seed=0):
    """Activations of hidden size 4096 where a handful of channels are 30x larger (the same
    channels on every rank), as in LLM residual streams."""
    xs = []
    for r in range(world):
        x = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(seed * 100 + r))
        x[:, list(outliers)] *= 30.0
        xs.append(x.flatten())
    return xs


def test_rotation_round_trip_is_near_exact():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1))
    for g in (32, 128, 1024):
        back = ref.rotate_inverse(ref.rotate_forward(x, g), g)
        assert torch.allclose(back, x, rtol=0, atol=g * 2**-22 * float(x.abs().max()))
        # H is orthogonal up to sqrt(g): norms scale exactly so
        y = ref.rotate_forward(x, g).double()
        assert abs(float(y.norm() ** 2 / (g * x.double().norm() ** 2)) - 1) < 1e-6


@pytest.mark.parametrize("algo", ["two_step", "ring", "semi_ring"])
def test_rotation_halves_int4_error_on_outlier_channels(algo):
    world = 4
    g = inproc.group(world)
    errs = {}
    for rotate in (False, True):
        g.set_config(
            qcomm.QuantConfig(algorithm=algo, rs_bits=4, ag_bits=4, min_bytes=0, rotate=rotate)
        )
        xs = _llm_like(world)
        out = g.allreduce(xs)[0]
        r = ref.allreduce(xs, algo, 4, 4, rotate=rotate)
        assert torch.equal(out, r.out)
        errs[rotate] = float((out.double() - r.exact).norm() / r.exact.norm())
    assert errs[True] * 2 <= errs[False], errs


def test_rotation_needs_whole_groups_only_internally():
    # any numel works: the last group is padded with zeros internally and cut off again
    g = inproc.group(3)
    g.set_config(qcomm.QuantConfig(min_bytes=0, rotate=True))
    for n in (1, 5, 129, 1000):
        xs = [torch.randn(n) for _ in range(3)]
        outs = g.allreduce(xs)
        assert outs[0].shape == (n,)
        assert torch.equal(outs[0], ref.allreduce(xs, rotate=True).out)
