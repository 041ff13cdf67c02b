"""The C++ codec against qcomm/reference.py: wire bytes, decoded values, error bound, edge
groups."""

import itertools
import math

import pytest
import torch
from checks import same_floats

import qcomm  # noqa: F401
from qcomm import _testing
from qcomm import reference as ref

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _roundtrip_cpp(x, bits, g, sym):
    b = qcomm.codec.encode(x, bits, g, sym)
    return b, qcomm.codec.decode(b, x.numel(), bits, g, sym)


@pytest.mark.parametrize(
    "bits,sym,g,dtype,n",
    list(itertools.product([4, 8], [True, False], [32, 128, 1024], DTYPES, [1, 7, 1000, 4099])),
)
def test_wire_bytes_and_values_match_reference(bits, sym, g, dtype, n):
    gen = torch.Generator().manual_seed(hash((bits, sym, g, n)) % 2**31)
    x = (torch.randn(n, generator=gen) * 3 + 0.5).to(dtype)
    c = ref.Codec(bits, g, sym)
    b, y = _roundtrip_cpp(x, bits, g, sym)
    assert b.numel() == qcomm.codec.encoded_bytes(n, bits, g, sym)
    assert torch.equal(b, ref.encode_bytes(x, c))
    y_ref, bound = ref.roundtrip(x, c)
    assert same_floats(y, y_ref)
    err = (y.double() - x.double()).abs()
    assert bool((err <= bound).all()), f"max err/bound {float((err / bound).max())}"


@pytest.mark.parametrize("bits,sym", list(itertools.product([4, 8], [True, False])))
def test_error_at_most_half_a_step(bits, sym):
    # Independently of the reference's bound: |x - x^| <= step / 2 with step = absmax / qmax or
    # (max - min) / L, computed here in float64, plus a relative 2^-20 for fp32 evaluation.
    g = 64
    x = torch.randn(64 * 50, generator=torch.Generator().manual_seed(1)) * 10
    _, y = _roundtrip_cpp(x, bits, g, sym)
    xg, yg = x.double().view(-1, g), y.double().view(-1, g)
    if sym:
        step = xg.abs().amax(1, keepdim=True) / (127 if bits == 8 else 7)
    else:
        step = (xg.amax(1, keepdim=True) - xg.amin(1, keepdim=True)) / (255 if bits == 8 else 15)
    err = (xg - yg).abs()
    assert bool((err <= step * (0.5 + 2**-20) + xg.abs() * 2**-20).all())
    # and the codec is not trivially exact: the error reaches a good part of its bound
    assert float((err / step).max()) > 0.4


def _edge_inputs():
    g = 32
    fmax = torch.finfo(torch.float32).max
    tiny = torch.finfo(torch.float32).tiny
    cases = {
        "zeros": torch.zeros(g),
        "constant": torch.full((g,), 3.25),
        "negative_constant": torch.full((g,), -1e-3),
        "outlier": torch.cat([torch.full((g - 1,), 0.01), torch.tensor([1e4])]),
        "tiny": torch.linspace(-1, 1, g) * tiny * 4,
        "denormal": torch.linspace(-1, 1, g) * 1e-42,
        "mixed_signs": torch.tensor([(-1) ** i * (i + 1) * 0.37 for i in range(g)]),
        "huge": torch.linspace(-1, 1, g) * fmax,
        "huge_positive": torch.linspace(0.5, 1, g) * fmax,
    }
    return cases


@pytest.mark.parametrize("name", list(_edge_inputs()))
@pytest.mark.parametrize("bits,sym", list(itertools.product([4, 8], [True, False])))
def test_edge_groups(name, bits, sym):
    x = _edge_inputs()[name]
    c = ref.Codec(bits, 32, sym)
    b, y = _roundtrip_cpp(x, bits, 32, sym)
    assert torch.equal(b, ref.encode_bytes(x, c))
    y_ref, bound = ref.roundtrip(x, c)
    assert same_floats(y, y_ref)
    assert bool(torch.isfinite(y).all()), "finite input must decode to finite output"
    assert bool(((y.double() - x.double()).abs() <= bound).all())
    if name in ("zeros", "constant", "negative_constant"):
        assert torch.equal(y, x), "constant groups decode exactly"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("bits,sym", list(itertools.product([4, 8], [True, False])))
def test_nonfinite_poisons_only_its_group(bad, bits, sym):
    x = torch.randn(96, generator=torch.Generator().manual_seed(2))
    x[40] = bad  # group 1 of three groups of 32
    b, y = _roundtrip_cpp(x, bits, 32, sym)
    assert torch.equal(b, ref.encode_bytes(x, ref.Codec(bits, 32, sym)))
    assert bool(torch.isnan(y[32:64]).all()), "the group holding a NaN/Inf decodes to NaN"
    assert bool(torch.isfinite(y[:32]).all()) and bool(torch.isfinite(y[64:]).all())


def test_wire_size_formula():
    # meta (fp32 scale, and midpoint when asymmetric) padded to 16 bytes, then ceil(n*bits/8)
    for n, bits, g, sym in itertools.product([1, 33, 1000], [4, 8], [32, 256], [True, False]):
        groups = math.ceil(n / g)
        meta = groups * 4 * (1 if sym else 2)
        want = (meta + 15) // 16 * 16 + math.ceil(n * bits / 8)
        assert qcomm.codec.encoded_bytes(n, bits, g, sym) == want


def test_raw_codec_is_a_cast():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(3)) * 1000
    for dt in (torch.bfloat16, torch.float16):
        assert same_floats(_testing.cast_from_float(x, dt).float(), x.to(dt).float())


def test_half_conversions_match_torch_on_every_fp16_value():
    # every 16-bit pattern as fp16 -> float (exact) and back (identity)
    h = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    f = _testing.cast_to_float(h)
    assert same_floats(f, h.float())
    back = _testing.cast_from_float(f, torch.float16)
    assert same_floats(back.float(), h.float())
    b = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    assert same_floats(_testing.cast_to_float(b), b.float())


def test_float_to_16bit_rounding_matches_torch():
    gen = torch.Generator().manual_seed(4)
    # random bit patterns cover normal, subnormal, huge, tiny, NaN and Inf floats
    bits = torch.randint(-(2**31), 2**31 - 1, (200000,), generator=gen, dtype=torch.int64)
    f = bits.to(torch.int32).view(torch.float32)
    # values near fp16's range edges and exact ties
    extra = torch.tensor(
        [
            65504.0,
            65519.99,
            65520.0,
            65536.0,
            6.1035156e-05,
            5.96e-08,
            2.98e-08,
            2.9802322e-08,
            1.0 + 2**-11,
            1.0 + 3 * 2**-11,
            1.0 + 2**-8,
            1.0 + 3 * 2**-8,
        ]
    )
    f = torch.cat([f, extra, -extra])
    for dt in (torch.float16, torch.bfloat16):
        assert same_floats(_testing.cast_from_float(f, dt).float(), f.to(dt).float()), dt


def test_invalid_codec_arguments():
    x = torch.randn(10)
    with pytest.raises(ValueError, match="rs_bits"):
        qcomm.codec.encode(x, 6, 128, True)
    with pytest.raises(ValueError, match="group_size"):
        qcomm.codec.encode(x, 8, 100, True)
    with pytest.raises(ValueError, match="dtype"):
        qcomm.codec.encode(torch.arange(10), 8, 128, True)


def test_the_public_codec_defaults_and_checks():
    # qcomm.codec (docs/api.md): 128-element asymmetric groups unless told, sizes that match what
    # encode returns, and a misuse named
    x = torch.randn(1000, generator=torch.Generator().manual_seed(11))
    enc = qcomm.codec.encode(x, 8)
    assert torch.equal(enc, qcomm.codec.encode(x, 8, 128, False))
    assert enc.numel() == qcomm.codec.encoded_bytes(1000, 8)
    assert qcomm.codec.encoded_bytes(1000, 0, dtype=torch.float16) == 2000
    assert torch.equal(qcomm.codec.decode(enc, 1000, 8), qcomm.codec.decode(enc, 1000, 8, 128))
    with pytest.raises(ValueError, match="accumulate=True adds into out="):
        qcomm.codec.decode(enc, 1000, 8, accumulate=True)
    with pytest.raises(ValueError, match="bytes"):
        qcomm.codec.decode(enc[:-1], 1000, 8)
