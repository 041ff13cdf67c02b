"""The CPU codec's fixed-size group loops (csrc/codec/codec_cpu_groups.h): for every group size
they specialise (32..1024, every size the config allows), 8 and 4 bits, symmetric and asymmetric,
fp32/fp16/bf16 input, rotated or not, deterministic and stochastic rounding, and message lengths
with a short last group (not a multiple of the group, of a vector's width, of 16 bytes), each
instruction set this CPU has gives the reference model's wire bytes and decoded values; groups
holding NaN or Inf decode to NaN, and groups whose codes need quantizeScaled's clamp keep it. The
full matrix is behind the `large` marker."""

import itertools

import pytest
import torch
from checks import same_floats

import qcomm
from qcomm import _C, _testing
from qcomm import reference as ref

ISAS = _C.cpu_isas()
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
GROUPS = [32, 64, 128, 256, 512, 1024]


@pytest.fixture
def isa(request):
    before = qcomm.set_cpu_isa(request.param)
    yield request.param
    qcomm.set_cpu_isa(before)


def _ulps_apart(v, k, i):
    """v and the float k ulps (bit patterns) beyond it, alternating."""
    b = torch.tensor(v, dtype=torch.float32).view(torch.int32)
    return torch.where(i % 2 == 0, b, b + k).view(torch.float32)


def _values(n, g, seed):
    """Normal values with, at fixed spots, what changes a group's path: a NaN, an Inf and a -Inf
    (each in its own group), a constant group, a group of zeros of both signs, a group a few ulps
    wide, tiny (denormal) values, values near FLT_MAX, then groups whose codes need the clamp of
    quantizeScaled: two values a few ulps apart whose asymmetric t falls outside [-1/2, L + 1/2)
    (t(hi) = 281 and 17.1 at 8 and 4 bits; t(lo) = -26 at 8 bits; t(lo) = -3.2 at 4 bits), and
    symmetric groups with a subnormal scale (absmax 190 and 10 units of 2^-149: t = 190 > 127 at
    8 bits, 10 > 7 at 4)."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 2 - 0.3
    i = torch.arange(n)
    tiny = 2.0**-149
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
        lambda s: x.__setitem__(s, _ulps_apart(330.43707275390625, 5, i[s])),
        lambda s: x.__setitem__(s, _ulps_apart(345.5841979980469, 5, i[s])),
        lambda s: x.__setitem__(s, _ulps_apart(-0.0005369532154873013, -3, i[s])),
        lambda s: x.__setitem__(s, (i[s] % 3 - 1).float() * (190 * tiny)),
        lambda s: x.__setitem__(s, (i[s] % 3 - 1).float() * (10 * tiny)),
    ]
    for k, put in enumerate(spots):
        if (k + 1) * g <= n:
            put(slice(k * g, (k + 1) * g))
    return x


def _check(bits, sym, g, dtype, n, rotate, noise=None, case=""):
    x = _values(n, g, seed=bits * 7 + g + n).to(dtype)
    c = ref.Codec(bits, g, sym)
    b = qcomm.codec.encode(
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
    y = qcomm.codec.decode(b, n, bits, g, sym, rotate=rotate)
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
    # elements (not a multiple of 16 bytes at any width); 13 groups hold every spot of _values
    return [8 * g, 13 * g + 1, 9 * g + 13, 13 * g - 11]


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
    # the loops take 8 groups at a time (one vector lane each): 11 full groups leave a block of 3
    # at the end, here holding a NaN group, a constant one and a normal one, then a short last
    # group
    for bits, sym, g in itertools.product([8, 4], [False, True], GROUPS):
        n = 11 * g + 5
        dtype = DTYPES[(bits + g) % 3]
        x = _values(n, g, seed=g + bits)
        x[8 * g + 2] = float("nan")
        x[9 * g : 10 * g] = -1.5
        x = x.to(dtype)
        c = ref.Codec(bits, g, sym)
        b = qcomm.codec.encode(x, bits, g, sym)
        case = f"{isa} {bits}b sym={sym} g={g} {dtype}"
        assert torch.equal(b, ref.encode_bytes(x, c)), f"{case}: wire bytes"
        y = qcomm.codec.decode(b, n, bits, g, sym)
        assert torch.isnan(y[8 * g : 9 * g]).all(), f"{case}: the NaN group"
        assert same_floats(y, ref.roundtrip(x, c)[0]), f"{case}: decoded values"


@pytest.mark.parametrize("isa", ISAS, indirect=True)
def test_stochastic_rounding_matches_reference(isa):
    # the noise of eight elements at once: element indices from a base past 2^32 - 1 too (the
    # hash takes the index's low and high words; the low word wraps inside a vector, in a group
    # of plain normal values)
    salt = ref.noise_salt(11, 1, 0)
    for bits, sym, g in itertools.product([8, 4], [False, True], [32, 256]):
        for k, dtype in enumerate(DTYPES):
            n = 16 * g + 13
            base = 4099 if k != 1 else 2**32 - 14 * g - 3
            case = f"{isa} noise {bits}b sym={sym} {g} {dtype} base={base}"
            _check(bits, sym, g, dtype, n, False, (salt, base), case)
            if k == 0:
                _check(bits, sym, g, dtype, 8 * g, True, (salt, base), f"{case} rotated")


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
        b = qcomm.codec.encode(y, bits, g, sym)
        qcomm.set_cpu_isa("generic")
        try:
            want = qcomm.codec.encode(y, bits, g, sym)
        finally:
            qcomm.set_cpu_isa(isa)
        assert torch.equal(b, want), f"{isa} {dtype} {bits}b sym={sym} g={g}"


@pytest.mark.parametrize("isa", ISAS, indirect=True)
def test_streamed_decode_matches_decode(isa):
    # decodeBlockStreamed (a large result's decode, non-temporal stores with AVX2 and up) writes
    # decodeBlock's bits: every group size, 8 and 4 bits, both kinds of scale, a short last group,
    # the special groups of _values; an output that is not 32-byte aligned takes decodeBlock, and
    # a stale output (NaN-filled) is overwritten everywhere
    for bits, sym, g in itertools.product([8, 4], [False, True], GROUPS):
        n = 13 * g + 13
        block = ref.encode_bytes(_values(n, g, seed=g + bits), ref.Codec(bits, g, sym))
        want = qcomm.codec.decode(block, n, bits, g, sym)
        room = torch.full((n + 8,), float("nan"))
        for offset in (0, 1):  # torch's storage is 64-byte aligned: 1 float in is not
            out = room[offset : offset + n]
            got = qcomm.codec.decode(block, n, bits, g, sym, out=out, streamed=True)
            assert same_floats(got, want), f"{isa} {bits}b sym={sym} g={g} offset={offset}"
    raw = torch.randn(1000)
    got = qcomm.codec.decode(raw.view(torch.uint8), 1000, 0, 128, False, streamed=True)
    assert same_floats(got, raw), f"{isa} raw block"


@pytest.mark.parametrize("isa", ISAS, indirect=True)
def test_decode_sum_of_blocks_matches_sequential_decodes(isa):
    # CpuCodecOps.decodeSum (two_step's sum of every rank's copy) decodes all blocks in one pass:
    # the bits of a decode then count - 1 decodes with accumulate, in list order (fp32 addition
    # is not associative, so the order shows), the special groups of _values included
    for bits, sym, g in itertools.product([8, 4], [False, True], [32, 128, 1024]):
        n = 13 * g + 13
        blocks = [
            ref.encode_bytes(_values(n, g, seed=g + k) * (k + 1), ref.Codec(bits, g, sym))
            for k in range(4)
        ]
        for count in (1, 2, 4):
            got = qcomm.codec.decode_sum(blocks[:count], n, bits, g, sym)
            want = qcomm.codec.decode(blocks[0], n, bits, g, sym)
            for b in blocks[1:count]:
                want = want + qcomm.codec.decode(b, n, bits, g, sym)
            assert same_floats(got, want), f"{isa} {bits}b sym={sym} g={g} count={count}"
            # accumulate: onto values already there (two_step's owner's own values), in order
            own = torch.randn(n, generator=torch.Generator().manual_seed(count)) * 3
            got = qcomm.codec.decode_sum(
                blocks[:count], n, bits, g, sym, out=own.clone(), accumulate=True
            )
            want = own
            for b in blocks[:count]:
                want = want + qcomm.codec.decode(b, n, bits, g, sym)
            assert same_floats(got, want), f"{isa} {bits}b sym={sym} g={g} count={count} acc"
    raw = [torch.randn(1000, generator=torch.Generator().manual_seed(k)) for k in range(4)]
    got = qcomm.codec.decode_sum([r.view(torch.uint8) for r in raw[:3]], 1000, 0, 128, False)
    assert same_floats(got, raw[0] + raw[1] + raw[2]), f"{isa} raw blocks"
    got = qcomm.codec.decode_sum(
        [r.view(torch.uint8) for r in raw[:2]],
        1000,
        0,
        128,
        False,
        out=raw[3].clone(),
        accumulate=True,
    )
    assert same_floats(got, raw[3] + raw[0] + raw[1]), f"{isa} raw blocks, accumulate"


@pytest.mark.parametrize("isa", ISAS, indirect=True)
def test_widening_matches_torch_on_every_16_bit_value(isa):
    # the loops' widening (F16C for fp16 where the level has it): every bit pattern, in a length
    # that leaves a tail of one-by-one elements, plain and added to fp32 values
    for dt in (torch.float16, torch.bfloat16):
        h = torch.arange(0, (1 << 16) + 5, dtype=torch.int32).to(torch.int16).view(dt)
        assert same_floats(_testing.cast_to_float(h), h.float()), f"{isa} {dt}"
        base = torch.randn(h.numel(), generator=torch.Generator().manual_seed(8))
        n = h.numel()
        src = ref.encode_bytes(base, ref.Codec(8, 128, False, dt))
        partial, _ = qcomm.codec.ring_hop(src, h, 8, 8, 128, False)
        want = qcomm.codec.decode(src, n, 8, 128, False) + h.float()
        assert same_floats(partial, want), f"{isa} {dt}: decoded + local"


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
        partial, dst = qcomm.codec.ring_hop(
            src,
            local,
            ib,
            ob,
            128,
            sym,
            noise_salt=None if noise is None else noise[0],
            noise_base=0 if noise is None else noise[1],
        )
        want = qcomm.codec.decode(src, n, ib, 128, sym) + local.float()
        case = f"{isa} {ib}->{ob} {dtype} sym={sym} stochastic={stochastic}"
        assert same_floats(partial, want), f"{case}: partial sums"
        assert torch.equal(dst, ref.encode_bytes(want, cout, noise)), f"{case}: wire bytes"
