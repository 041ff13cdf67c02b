"""The CPU codec's group loops, compiled once per instruction set (csrc/codec/codec_cpu_isa.h):
every one this CPU has gives the reference model's bytes and values, in the codec and in the
algorithms' accumulating sums, and a QCOMM_CPU_ISA that is unknown or unavailable is an error
naming it."""

import itertools
import os
import subprocess
import sys

import inproc
import pytest
import torch
from checks import same_floats

import qcomm
from qcomm import _C, _testing
from qcomm import reference as ref

ISAS = _C.cpu_isas()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture
def isa(request):
    before = qcomm.set_cpu_isa(request.param)
    yield request.param
    qcomm.set_cpu_isa(before)


def test_instruction_sets_listed_and_widest_by_default():
    assert qcomm.cpu_isas() == ISAS and qcomm.cpu_isa() == _C.cpu_isa()
    assert ISAS[0] == "generic", ISAS
    assert set(ISAS) <= {"generic", "avx2", "avx512"}, ISAS
    # the ones the build has are listed in order of width; a CPU with AVX-512 has AVX2
    assert ISAS == [i for i in ("generic", "avx2", "avx512") if i in ISAS]
    assert "avx512" not in ISAS or "avx2" in ISAS
    if os.environ.get("QCOMM_CPU_ISA", "auto") == "auto":
        assert _C.cpu_isa() == ISAS[-1]


def _values(n, seed):
    """Normal values with the codec's special cases at fixed spots: NaN, +-Inf, a constant group,
    huge and denormal values, and groups a few fp32 ulps wide."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 3 + 0.5
    i = torch.arange(n)
    if n >= 4096:
        x[5], x[700], x[1500] = float("nan"), float("inf"), float("-inf")
        x[1024:2048] = 0.25
        x[2048:2304] = torch.finfo(torch.float32).max * torch.sin(i[2048:2304].float())
        x[2304:2560] = 1e-42 * (i[2304:2560] % 7 - 3).float()
        k = (i[3072:3584] % 7).to(torch.int32)
        x[3072:3584] = (torch.tensor(1000.0).view(torch.int32) + k).view(torch.float32)
    return x


@pytest.mark.parametrize("isa", ISAS, indirect=True)
def test_codec_matches_reference_in_every_instruction_set(isa):
    assert _C.cpu_isa() == isa
    for bits, sym, g, dtype, n in itertools.product(
        [4, 8], [True, False], [32, 128, 1024], DTYPES, [7, 4099, 5000]
    ):
        x = _values(n, seed=n + g + bits).to(dtype)
        c = ref.Codec(bits, g, sym)
        case = f"{isa} bits={bits} sym={sym} g={g} {dtype} n={n}"
        b = qcomm.codec.encode(x, bits, g, sym)
        assert torch.equal(b, ref.encode_bytes(x, c)), f"{case}: wire bytes"
        y = qcomm.codec.decode(b, n, bits, g, sym)
        assert same_floats(y, ref.roundtrip(x, c)[0]), f"{case}: decoded values"
    # stochastic rounding
    x = _values(5000, seed=3)
    salt = ref.noise_salt(5, 1, 0)
    for bits, sym in itertools.product([4, 8], [True, False]):
        b = qcomm.codec.encode(x, bits, 64, sym, noise_salt=salt, noise_base=777)
        assert torch.equal(b, ref.encode_bytes(x, ref.Codec(bits, 64, sym), (salt, 777))), isa


@pytest.mark.parametrize("isa", ISAS, indirect=True)
def test_rotated_codec_matches_reference_in_every_instruction_set(isa):
    # the rotation fused into the codec (each group rotated on its way in and out) gives the bits
    # of the reference's separate passes: encode(H x), and H decode / g
    assert _C.cpu_isa() == isa
    for bits, sym, g, dtype in itertools.product([0, 4, 8], [True, False], [32, 128, 1024], DTYPES):
        if bits == 0 and not sym:
            continue
        n = 5 * g
        x = _values(6144, seed=g + bits)[:n].to(dtype)
        case = f"{isa} bits={bits} sym={sym} g={g} {dtype}"
        rot = ref.rotate_forward(x, g)
        assert same_floats(_testing.rotate_to_float(x, g), rot), f"{case}: rotation"
        b = qcomm.codec.encode(x, bits, g, sym, rotate=True)
        if bits == 0:  # raw: the rotated values as fp32
            assert torch.equal(b, rot.view(torch.uint8)), f"{case}: raw wire bytes"
            back = qcomm.codec.decode(b, n, 0, g, sym, rotate=True)
            assert same_floats(back, ref.rotate_inverse(rot, g)), f"{case}: raw decoded"
            continue
        c = ref.Codec(bits, g, sym)
        assert torch.equal(b, ref.encode_bytes(rot, c)), f"{case}: wire bytes"
        y = qcomm.codec.decode(b, n, bits, g, sym, rotate=True)
        want = ref.rotate_inverse(ref.roundtrip(rot, c)[0], g)
        assert same_floats(y, want), f"{case}: decoded values"
    with pytest.raises(ValueError, match="whole groups of 32"):
        qcomm.codec.encode(torch.ones(40), 8, 32, True, rotate=True)


@pytest.mark.parametrize("isa", ISAS, indirect=True)
def test_accumulating_sums_match_reference_in_every_instruction_set(isa):
    # two_step's owners decode W copies with accumulate; the ring's hops decode with accumulate
    g = inproc.group(3)
    gen = torch.Generator().manual_seed(8)
    for algo, bits in [("two_step", (8, 8)), ("two_step", (4, 8)), ("ring", (4, 4))]:
        g.set_config(
            qcomm.QuantConfig(algorithm=algo, rs_bits=bits[0], ag_bits=bits[1], min_bytes=0)
        )
        xs = [torch.randn(20000, generator=gen) * (r + 1) for r in range(3)]
        outs = g.allreduce(xs)
        r = ref.allreduce(xs, algo, bits[0], bits[1])
        for o in outs:
            assert same_floats(o, r.out), f"{isa} {algo} {bits}: differs from the reference"


def test_set_cpu_isa_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match=r"'sse9' \(not an instruction set\); allowed: auto, "):
        qcomm.set_cpu_isa("sse9")
    before = qcomm.set_cpu_isa("auto")
    assert _C.cpu_isa() == ISAS[-1]
    qcomm.set_cpu_isa(before)
    assert _C.cpu_isa() == before


def test_environment_variable_chooses_and_is_checked():
    # read when a qnccl group is created (so a bad value fails there, on every rank), then used
    code = (
        "import tempfile, torch, torch.distributed as dist, qcomm\n"
        "from qcomm import _C\n"
        "try:\n"
        "    dist.init_process_group('qnccl', init_method='file://' + tempfile.mktemp(),\n"
        "                            rank=0, world_size=1)\n"
        "    x = torch.ones(1 << 20)\n"
        "    dist.all_reduce(x)\n"
        "    print('isa', _C.cpu_isa(), float(x[0]))\n"
        # without it torch's Gloo group aborts at exit now and then (8 of 20 runs of a plain
        # Gloo group here: "terminate called without an active exception")
        "    dist.destroy_process_group()\n"
        "except ValueError as e:\n"
        "    print('error', e)\n"
    )

    def run(value):
        env = dict(os.environ, QCOMM_CPU_ISA=value)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip().splitlines()[-1]

    assert run("generic") == "isa generic 1.0"
    assert run("auto") == f"isa {ISAS[-1]} 1.0"
    bad = run("avx9000")
    assert bad.startswith("error qcomm: invalid QCOMM_CPU_ISA='avx9000'; allowed: auto, "), bad
