"""The CPU encoder's fixed-size group loops (csrc/codec/codec_cpu_groups.h): for every group size
they specialise (32..1024, every size the config allows), 8 and 4 bits, symmetric and asymmetric,
fp32/fp16/bf16 input, rotated or not, and message lengths with a short last group (not a multiple
of the group, of a vector's width, of 16 bytes), each instruction set this CPU has gives the
reference model's wire bytes and decoded values, as do the stochastic path (codec.h's loops) and
groups holding NaN or Inf, which decode to NaN. The full matrix is behind the `large` marker."""

import itertools

import pytest
import torch
from checks import same_floats

from qcomm import _C
from qcomm import reference as ref

ISAS = _C.cpu_isas()
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
GROUPS = [32, 64, 128, 256, 512, 1024]


@pytest.fixture
def isa(request):
    before = _C._testing.set_cpu_isa(request.param)
    yield request.param
    _C._testing.set_cpu_isa(before)


def _values(n, g, seed):
    """Normal values with, at fixed spots, what changes a group's path: a NaN, an Inf and a -Inf
    (each in its own group), a constant group, a group of zeros of both signs, a group a few ulps
    wide, tiny (denormal) values and values near FLT_MAX."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 2 - 0.3
    i = torch.arange(n)
    spots = [
        lambda s: x.__setitem__(s.start + 3, float("nan")),
        lambda s: x.__setitem__(s.start + 1, float("inf")),
        lambda s: x.__setitem__(s.stop - 1, float("-inf")),
        lambda s: x.__setitem__(s, 0.75),
        lambda s: x.__setitem__(s, torch.where(i[s] % 2 == 0, 0.0, -0.0)),
        lambda s: x.__setitem__(
            s, (torch.tensor(3.0).view(torch.int32) + (i[s] % 5).int()).view(torch.float32)
        ),
        lambda s: x.__setitem__(s, 1e-41 * (i[s] % 9 - 4).float()),
        lambda s: x.__setitem__(s, torch.finfo(torch.float32).max * torch.cos(i[s].float())),
    ]
    for k, put in enumerate(spots):
        if (k + 1) * g <= n:
            put(slice(k * g, (k + 1) * g))
    return x


def _check(bits, sym, g, dtype, n, rotate, noise=None, case=""):
    x = _values(n, g, seed=bits * 7 + g + n).to(dtype)
    c = ref.Codec(bits, g, sym)
    b = _C._testing.codec_encode(
        x,
        bits,
        g,
        sym,
        noise_salt=None if noise is None else noise[0],
        noise_base=0 if noise is None else noise[1],
        rotate=rotate,
    )
    src = ref.rotate_forward(x, g) if rotate else x
    assert torch.equal(b, ref.encode_bytes(src, c, noise)), f"{case}: wire bytes"
    y = _C._testing.codec_decode(b, n, bits, g, sym, rotate=rotate)
    want = ref.roundtrip(src, c)[0] if noise is None else None
    if want is not None:
        want = ref.rotate_inverse(want, g) if rotate else want
        assert same_floats(y, want), f"{case}: decoded values"
    if not rotate and n >= 3 * g:
        # the groups holding NaN, Inf and -Inf decode to NaN; the constant group exactly
        for k in range(3):
            assert torch.isnan(y[k * g : (k + 1) * g]).all(), f"{case}: group {k} not NaN"
    return b


def _lengths(g):
    # whole groups; a short last group of 1, 13 (not a multiple of a vector) and g - 16 + 5
    # elements (not a multiple of 16 bytes at any width)
    return [8 * g, 8 * g + 1, 9 * g + 13, 9 * g - 11]


@pytest.mark.parametrize("isa", ISAS, indirect=True)
def test_fixed_size_loops_match_reference(isa):
    # every group size and path, each dtype once: a fast default tier
    for k, (bits, sym, g) in enumerate(itertools.product([8, 4], [False, True], GROUPS)):
        dtype = DTYPES[k % 3]
        for n in _lengths(g)[k % 2 :: 2]:
            _check(
                bits, sym, g, dtype, n, False, case=f"{isa} {bits}b sym={sym} g={g} {dtype} n={n}"
            )
        _check(bits, sym, g, dtype, 8 * g, True, case=f"{isa} rotated {bits}b sym={sym} g={g}")


@pytest.mark.parametrize("isa", ISAS, indirect=True)
def test_a_short_block_of_groups_with_special_ones(isa):
    # the loops take up to 8 groups at a time (blockGroups: 8 of 64 and 128, 4 of 256, 2 of 512,
    # 1 of 32 and 1024): 11 full groups leave a block of 3 (1 of 256, 1 of 512) at the end, here
    # holding a NaN group, a constant one and a normal one, then a short last group
    for bits, sym, g in itertools.product([8, 4], [False, True], GROUPS):
        n = 11 * g + 5
        dtype = DTYPES[(bits + g) % 3]
        x = _values(n, g, seed=g + bits)
        x[8 * g + 2] = float("nan")
        x[9 * g : 10 * g] = -1.5
        x = x.to(dtype)
        c = ref.Codec(bits, g, sym)
        b = _C._testing.codec_encode(x, bits, g, sym)
        case = f"{isa} {bits}b sym={sym} g={g} {dtype}"
        assert torch.equal(b, ref.encode_bytes(x, c)), f"{case}: wire bytes"
        y = _C._testing.codec_decode(b, n, bits, g, sym)
        assert torch.isnan(y[8 * g : 9 * g]).all(), f"{case}: the NaN group"
        assert same_floats(y, ref.roundtrip(x, c)[0]), f"{case}: decoded values"


@pytest.mark.parametrize("isa", ISAS, indirect=True)
def test_stochastic_rounding_keeps_its_loops(isa):
    salt = ref.noise_salt(11, 1, 0)
    for bits, sym, g in itertools.product([8, 4], [False, True], [32, 256]):
        for dtype in DTYPES:
            n = 9 * g + 13
            _check(bits, sym, g, dtype, n, False, (salt, 4099), f"{isa} noise {bits}b {g} {dtype}")


@pytest.mark.large
@pytest.mark.parametrize("isa", ISAS, indirect=True)
def test_fixed_size_loops_full_matrix(isa):
    salt = ref.noise_salt(3, 0, 1)
    for bits, sym, g, dtype in itertools.product([8, 4], [False, True], GROUPS, DTYPES):
        case = f"{isa} {bits}b sym={sym} g={g} {dtype}"
        for n in _lengths(g):
            _check(bits, sym, g, dtype, n, False, case=f"{case} n={n}")
            _check(bits, sym, g, dtype, n, False, (salt, 77), case=f"{case} n={n} noise")
        _check(bits, sym, g, dtype, 8 * g, True, case=f"{case} rotated")


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "generic"], indirect=True)
def test_every_instruction_set_gives_the_generic_bytes(isa):
    # on a long message of mixed groups, the widest loops against the baseline's
    x = _values(1 << 16, 128, seed=5)
    for dtype, bits, sym, g in itertools.product(DTYPES, [8, 4], [False, True], [32, 128]):
        y = x.to(dtype)
        b = _C._testing.codec_encode(y, bits, g, sym)
        _C._testing.set_cpu_isa("generic")
        try:
            want = _C._testing.codec_encode(y, bits, g, sym)
        finally:
            _C._testing.set_cpu_isa(isa)
        assert torch.equal(b, want), f"{isa} {dtype} {bits}b sym={sym} g={g}"


@pytest.mark.parametrize("isa", ISAS, indirect=True)
def test_fused_hop_matches_reference_across_pieces(isa):
    # CpuCodecOps.decodeAddEncode decodes, adds and encodes piece by piece (16384 elements): a
    # message of several pieces and a short last group gives the bits of the three passes
    n = 3 * 16384 + 1000 + 7
    for (ib, ob), dtype, sym, stochastic in itertools.product(
        [(8, 8), (4, 4), (8, 4)], [torch.float32, torch.bfloat16], [False, True], [False, True]
    ):
        gen = torch.Generator().manual_seed(ib + ob + sym)
        received = _values(n, 128, seed=ib)
        local = (torch.randn(n, generator=gen) * 2).to(dtype)
        cin, cout = ref.Codec(ib, 128, sym, dtype), ref.Codec(ob, 128, sym, dtype)
        src = ref.encode_bytes(received, cin)
        noise = (ref.noise_salt(9, 0, 0), 123) if stochastic else None
        partial, dst = _C._testing.codec_ops_hop(
            src,
            ib,
            local,
            ob,
            128,
            sym,
            None if noise is None else noise[0],
            0 if noise is None else noise[1],
        )
        want = _C._testing.codec_decode(src, n, ib, 128, sym) + local.float()
        case = f"{isa} {ib}->{ob} {dtype} sym={sym} stochastic={stochastic}"
        assert same_floats(partial, want), f"{case}: partial sums"
        assert torch.equal(dst, ref.encode_bytes(want, cout, noise)), f"{case}: wire bytes"
