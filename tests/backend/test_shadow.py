"""Shadow mode (QuantConfig.shadow): every N-th quantized allreduce also runs the exact allreduce of
a copy and records the quantized result's error, per size class, in stats()["shadow"]; the caller
still gets the quantized result, bit for bit what it gets without shadowing."""

import os

import inproc
import pytest
import torch
import torch.distributed as dist

import qcomm
from qcomm import reference as ref

from dist_util import run_ranks

WORLD = 3


def _inputs(n, seed, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=gen) * scale * (r + 1) for r in range(WORLD)]


def _errors(out, xs):
    """relative L2 and max absolute error of `out` against the fp32 sum of xs in rank order (what
    Gloo computes, up to its summation order: far below the codec's error)."""
    exact = xs[0].double().clone()
    for x in xs[1:]:
        exact += x.double()
    d = out.double() - exact
    return float(d.norm() / exact.norm()), float(d.abs().max())


@pytest.fixture
def group():
    g = inproc.group(WORLD)
    for b in g.backends:
        b.reset_stats()
    yield g
    g.set_config(qcomm.QuantConfig(min_bytes=0))
    for b in g.backends:
        b.reset_stats()


def test_every_nth_call_is_shadowed_and_its_error_recorded(group):
    group.set_config(qcomm.QuantConfig(algorithm="two_step", rs_bits=4, min_bytes=0, shadow=2))
    seq0 = group.stats()["next_call_seq"]
    rels, maxes = [], []
    for k in range(6):
        xs = _inputs(50000, seed=k, scale=k + 1)
        outs = group.allreduce(xs)
        r = ref.allreduce(xs, "two_step", 4, 8)
        for o in outs:
            assert torch.equal(o, r.out), f"call {k}: shadowing changed the result"
        if (seq0 + k) % 2 == 0:
            rel, mx = _errors(outs[0], xs)
            rels.append(rel)
            maxes.append(mx)
    for rank in range(WORLD):
        shadow = group.stats(rank)["shadow"]
        assert list(shadow) == ["float32 128 KiB to 256 KiB"], shadow
        s = shadow["float32 128 KiB to 256 KiB"]
        assert s["calls"] == 3
        assert s["rel_l2_mean"] == pytest.approx(sum(rels) / 3, rel=1e-4)
        assert s["rel_l2_max"] == pytest.approx(max(rels), rel=1e-4)
        assert s["max_abs_error"] == pytest.approx(max(maxes), rel=1e-3)
        assert s["seconds"] > 0
        # an int4 reduce phase is far from exact: the recorded error is the codec's, not zero
        assert 1e-3 < s["rel_l2_max"] < 0.2
    assert group.stats()["quantized_calls"] == 6
    for b in group.backends:
        b.reset_stats()
    assert group.stats()["shadow"] == {}


def test_off_by_default_and_averages_and_non_finite_inputs(group):
    group.set_config(qcomm.QuantConfig(min_bytes=0))
    group.allreduce(_inputs(4096, seed=1))
    assert group.stats()["shadow"] == {}
    group.set_config(qcomm.QuantConfig(algorithm="ring", min_bytes=0, shadow=1))
    xs = _inputs(4096, seed=2)
    xs[1][100] = float("nan")
    out = group.allreduce(xs, op="avg")[0]
    assert torch.isnan(out[100])  # non-finite stays non-finite, and is left out of the error
    s = group.stats()["shadow"]["float32 16 KiB to 32 KiB"]
    keep = torch.ones(4096, dtype=torch.bool)
    keep[100 - 100 % 128 : 100 - 100 % 128 + 128] = False  # the NaN's group decodes to NaN
    exact = (xs[0].double() + xs[1].double() + xs[2].double()) / WORLD
    d = (out.double() - exact)[keep]
    assert s["calls"] == 1
    # the NaN's whole group is NaN in the result but finite in the exact sum (but for element
    # 100): a non-finite result where the exact one is finite counts as an infinite error
    assert s["max_abs_error"] == float("inf") and s["rel_l2_max"] == float("inf")
    assert float(d.abs().max()) < 0.05


def test_bf16_and_the_error_bound(group):
    group.set_config(qcomm.QuantConfig(min_bytes=0, shadow=1))
    xs = [x.bfloat16() for x in _inputs(20000, seed=3)]
    out = group.allreduce(xs)[0]
    s = group.stats()["shadow"]["bfloat16 32 KiB to 64 KiB"]
    assert s["calls"] == 1
    # Gloo's exact bf16 sum is itself rounded to bf16 (twice, for three ranks), so it differs from
    # the float64 sum by at most 2 * 2^-8 of the sum of magnitudes
    r = ref.allreduce([x.float() for x in xs])
    mags = sum(x.double().abs() for x in xs)
    slack = float(mags.max()) * 2 * 2**-8
    assert (
        s["max_abs_error"] <= float(r.bound.max()) + float(out.double().abs().max()) * 2**-8 + slack
    )
    rel, _ = _errors(out, [x.float() for x in xs])
    assert abs(s["rel_l2_max"] - rel) <= 2 * 2**-8 * float(mags.norm() / r.exact.norm())


def test_invalid_shadow_values_are_refused():
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="invalid shadow"):
            qcomm.QuantConfig(shadow=bad)


def _mismatch_worker(rank, world):
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0))
    try:  # set_config is collective: ranks that set different configs all raise there
        qcomm.set_config(qcomm.QuantConfig(min_bytes=0, shadow=1 if rank == 0 else 0))
        raised = ""
    except ValueError as e:
        raised = str(e)
    x = torch.ones(4096)
    dist.all_reduce(x)  # both still on the config before
    # the group stays usable, and qcomm.shadow sets every rank alike
    qcomm.shadow(every=1)
    y = torch.full((4096,), float(rank + 1))
    dist.all_reduce(y)
    return raised, qcomm.get_config().shadow, qcomm.stats()["shadow"], float(y[0])


def test_ranks_that_disagree_raise_and_qcomm_shadow_sets_it():
    for raised, every, shadow, y0 in run_ranks(_mismatch_worker, 2):
        assert "set_config: the ranks set different" in raised, raised
        assert "shadow: rank 0: 1, rank 1: 0" in raised, raised
        assert every == 1
        assert shadow["float32 16 KiB to 32 KiB"]["calls"] == 1, shadow
        assert y0 == pytest.approx(3.0, rel=0.01)


def test_readme_says_cuda_allreduces_are_not_shadowed():
    # the CUDA path has no shadow run (csrc/backend/call_cuda.cpp warns once instead): the
    # manual must not offer it there
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "README.md")) as f:
        text = f.read()
    para = text[text.index("**Shadow mode.**") :].split("\n\n")[0]
    assert "CUDA allreduces are not shadowed" in para, para
