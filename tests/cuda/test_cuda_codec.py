"""The CUDA codec kernels against the CPU codec, bit for bit (DESIGN invariant 3). Runs where a
GPU is present (scripts/gpu_check.sh); skips elsewhere."""

import itertools
import os
import sys

import pytest
import torch
from checks import GPU_ONLY, same_floats

from qcomm import reference as ref

sys.path.insert(
    0,
    os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"
    ),
)
import ncu_codec  # noqa: E402  (the kernels' template arguments from their demangled names)

import qcomm
from qcomm import _testing

pytestmark = GPU_ONLY


def _inputs():
    g = torch.Generator().manual_seed(0)
    fmax = torch.finfo(torch.float32).max
    yield "normal", torch.randn(70001, generator=g) * 3
    yield "outliers", torch.cat([torch.randn(5000, generator=g), torch.tensor([1e4, -3e3])])
    yield "zeros", torch.zeros(1000)
    yield "constant", torch.full((777,), 0.498830080032)
    yield "huge", torch.linspace(-1, 1, 4096) * fmax
    yield "denormal", torch.linspace(-1, 1, 4096) * 1e-42
    x = torch.randn(3000, generator=g)
    x[5], x[2000] = float("nan"), float("inf")
    yield "nonfinite", x
    yield "one", torch.tensor([1.5])


@pytest.mark.parametrize(
    "bits,sym,group,dtype",
    list(
        itertools.product(
            [4, 8], [True, False], [32, 128, 1024], [torch.float32, torch.bfloat16, torch.float16]
        )
    ),
)
def test_cuda_matches_cpu(bits, sym, group, dtype):
    for name, x in _inputs():
        x = x.to(dtype)
        cpu = qcomm.codec.encode(x, bits, group, sym)
        gpu = qcomm.codec.encode(x.cuda(), bits, group, sym).cpu()
        assert torch.equal(cpu, gpu), f"{name}: wire bytes differ"
        y_cpu = qcomm.codec.decode(cpu, x.numel(), bits, group, sym)
        y_gpu = qcomm.codec.decode(gpu.cuda(), x.numel(), bits, group, sym).cpu()
        same = torch.equal(torch.isnan(y_cpu), torch.isnan(y_gpu))
        same = same and torch.equal(y_cpu[~torch.isnan(y_cpu)], y_gpu[~torch.isnan(y_gpu)])
        assert same, f"{name}: decoded values differ"


@pytest.mark.parametrize("bits,sym", [(4, True), (8, False)])
def test_cuda_stochastic_matches_cpu(bits, sym):
    x = torch.randn(50000, generator=torch.Generator().manual_seed(1))
    salt = ref.noise_salt(9, 1, 0)
    cpu = qcomm.codec.encode(x, bits, 128, sym, noise_salt=salt, noise_base=4096)
    gpu = qcomm.codec.encode(x.cuda(), bits, 128, sym, noise_salt=salt, noise_base=4096)
    assert torch.equal(cpu, gpu.cpu())


# ---- every path of the vectorised kernels: the same cases the SIMT emulator runs on CPU ----


def _special(n, seed):
    """Normal values with NaN, +-Inf, constant groups, zeros of both signs, huge and denormal
    values, and groups a few fp32 ulps wide (the asymmetric encoders keep their clamp there) at
    fixed spots (tests/native/simt/codec_main.cpp places them alike)."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 3
    fmax = torch.finfo(torch.float32).max
    spots = {0: float("nan"), 40: float("inf"), 300: float("-inf"), 3000: 1e4}
    for i, v in spots.items():
        if i < n:
            x[i] = v
    x[1024:2048] = 0.5
    i = torch.arange(n)
    zeros = (i >= 2048) & (i < 2304)
    x[zeros] = torch.where(i[zeros] % 2 == 1, 0.0, -0.0)
    huge = (i >= 2304) & (i < 2560)
    x[huge] = fmax * torch.sin(i[huge].float())
    tiny = (i >= 2560) & (i < 2816)
    x[tiny] = 1e-42 * (i[tiny] % 7 - 3).float()
    # 1000 and -0.37 moved i % 7 ulps towards +inf (codec.h asymCodesInRange refuses some)
    few = (i >= 3072) & (i < 3584)
    k = (i[few] % 7).to(torch.int32)
    up = torch.tensor(1000.0).view(torch.int32) + k
    down = torch.tensor(-0.37).view(torch.int32) - k
    x[few] = torch.where(i[few] < 3328, up, down).view(torch.float32)
    return x


@pytest.mark.parametrize("group", [32, 64, 128, 256, 512, 1024])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_vector_and_scalar_paths_match_cpu(group, dtype):
    # whole slabs, a partial last slab, a tiny message, and a misaligned input and output (the
    # scalar paths); decode with and without accumulate
    for bits, sym in itertools.product([4, 8], [True, False]):
        for n, offset in [(4096, 0), (3000 + group // 2 + 3, 0), (2205, 1), (37, 0)]:
            base = _special(n + offset, seed=n + group).to(dtype)
            x = base[offset:]
            cpu = qcomm.codec.encode(x, bits, group, sym)
            gpu = qcomm.codec.encode(base.cuda()[offset:], bits, group, sym)
            case = f"bits={bits} sym={sym} n={n} offset={offset}"
            assert torch.equal(cpu, gpu.cpu()), f"{case}: wire bytes differ"
            init = (torch.arange(n + 1) % 13 - 6).float()
            for acc in (False, True):
                store = init.cuda()
                out = store[offset : offset + n]
                qcomm.codec.decode(gpu, n, bits, group, sym, out=out, accumulate=acc)
                want = qcomm.codec.decode(cpu, n, bits, group, sym)
                if acc:
                    want = init[offset : offset + n] + want
                assert same_floats(want, out.cpu()), f"{case} accumulate={acc}: values differ"


LAUNCH_SETTINGS = ("QCOMM_CUDA_FULL_GRID", "QCOMM_CUDA_ENCODE_BLOCKS")


def _launch_settings(monkeypatch, settings):
    """Exactly `settings` of the codec launch settings in the environment, then the process's
    settings reloaded: they are read once per process and kept (csrc/common/settings.h)."""
    for k in LAUNCH_SETTINGS:
        monkeypatch.delenv(k, raising=False)
    for k, v in settings.items():
        monkeypatch.setenv(k, v)
    qcomm.reload_settings()


@pytest.fixture
def launch_settings(monkeypatch):
    """launch_settings(settings) sets them (above); afterwards the caller's environment and the
    settings it gives are back."""
    yield lambda settings: _launch_settings(monkeypatch, settings)
    monkeypatch.undo()  # the caller's environment back, before the reload below reads it
    qcomm.reload_settings()


@pytest.mark.parametrize(
    "settings",
    [
        {"QCOMM_CUDA_ENCODE_BLOCKS": "4"},
        {"QCOMM_CUDA_ENCODE_BLOCKS": "3"},
        {"QCOMM_CUDA_FULL_GRID": "1"},
        {"QCOMM_CUDA_FULL_GRID": "1", "QCOMM_CUDA_ENCODE_BLOCKS": "4"},
        {},
        {"QCOMM_CUDA_FULL_GRID": "auto", "QCOMM_CUDA_ENCODE_BLOCKS": "auto"},
        {"QCOMM_CUDA_FULL_GRID": "0", "QCOMM_CUDA_ENCODE_BLOCKS": "3"},
    ],
    ids=[
        "encode_blocks_4",
        "encode_blocks_3",
        "full_grid",
        "full_grid_4_blocks",
        "default",
        "auto",
        "resident_3_blocks",
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_launch_variants_give_the_same_bytes(dtype, settings, launch_settings):
    # the launch shapes the settings force, on a message large enough that every warp of the
    # encoder and every block of the decoder takes several turns of the resident grid:
    # QCOMM_CUDA_ENCODE_BLOCKS=4 and 3 (every encoder compiled for 4 blocks per SM, spilling in
    # most variants, or 3), QCOMM_CUDA_FULL_GRID=1 (every block the work needs, one turn each),
    # alone and with 4 encoder blocks; the default, which from 10 Mi elements gives the decoders
    # and the 4-block encoders (fp32 but 8-bit asymmetric) the full grid, the same written "auto",
    # and QCOMM_CUDA_FULL_GRID=0 with QCOMM_CUDA_ENCODE_BLOCKS=3 (the resident grid, 3-block
    # encoders: the default before 2026-11-30); a partial last slab; the CPU codec's bytes and
    # values either way
    launch_settings(settings)
    n = 12 * 2**20 + 77
    x = (torch.randn(n, generator=torch.Generator().manual_seed(3)) * 2).to(dtype)
    for bits, sym in itertools.product([4, 8], [True, False]):
        cpu = qcomm.codec.encode(x, bits, 128, sym)
        gpu = qcomm.codec.encode(x.cuda(), bits, 128, sym)
        assert torch.equal(cpu, gpu.cpu()), f"bits={bits} sym={sym}: wire bytes differ"
        want = qcomm.codec.decode(cpu, n, bits, 128, sym)
        got = qcomm.codec.decode(gpu, n, bits, 128, sym).cpu()
        assert same_floats(want, got), f"bits={bits} sym={sym}: values differ"


@pytest.mark.parametrize(
    "settings,codec,blocks",
    [
        ({}, (torch.float32, 8, False), 3),
        ({}, (torch.float32, 8, True), 4),
        ({}, (torch.float32, 4, False), 4),
        ({}, (torch.bfloat16, 4, False), 3),
        ({"QCOMM_CUDA_ENCODE_BLOCKS": "auto"}, (torch.float32, 4, True), 4),
        ({"QCOMM_CUDA_ENCODE_BLOCKS": "4"}, (torch.float32, 8, False), 4),
        ({"QCOMM_CUDA_ENCODE_BLOCKS": "3"}, (torch.float32, 4, False), 3),
    ],
    ids=[
        "default_fp32_8_asym",
        "default_fp32_8_sym",
        "default_fp32_4_asym",
        "default_bf16_4_asym",
        "auto_fp32_4_sym",
        "encode_blocks_4",
        "encode_blocks_3",
    ],
)
def test_cuda_encode_setting_picks_its_kernel(settings, codec, blocks, launch_settings):
    # the launch variants give the same bytes (above), so only the kernel's name tells that the
    # setting took effect: read from the profiler's record of the launch
    from torch.profiler import ProfilerActivity, profile

    launch_settings(settings)
    # by default 4 blocks per SM for fp32 input but the 8-bit asymmetric codec, 3 otherwise
    # (csrc/cuda/tuning.h)
    dtype, bits, sym = codec
    x = torch.randn(2**20, device="cuda").to(dtype)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        qcomm.codec.encode(x, bits, 128, sym)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if "encodeKernel" in e.name]
    if not prof.events():
        pytest.skip("the profiler recorded no CUDA activity on this machine")
    assert names, [e.name for e in prof.events()]
    type_name = {torch.float32: "float", torch.bfloat16: "qcomm::bf16_t"}[dtype]
    want = ("encode", [type_name, str(bits), "true" if sym else "false", str(blocks)])
    assert all(ncu_codec.template_args(n) == want for n in names), names


@pytest.mark.parametrize(
    "setting,value", [("QCOMM_CUDA_FULL_GRID", "2"), ("QCOMM_CUDA_ENCODE_BLOCKS", "8")]
)
def test_cuda_launch_setting_refuses_a_bad_value(setting, value, launch_settings):
    # a value the setting does not allow: the launch raises ValueError (std::invalid_argument)
    # naming the variable and the value, rather than running some default
    launch_settings({setting: value})
    x = torch.randn(4096, device="cuda")
    with pytest.raises(ValueError, match=f"{setting}='{value}'"):
        qcomm.codec.encode(x, 8, 128, True)
    launch_settings({})
    assert torch.equal(
        qcomm.codec.encode(x, 8, 128, True).cpu(),
        qcomm.codec.encode(x.cpu(), 8, 128, True),
    )


@pytest.mark.parametrize("local_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_ring_hop_matches_cpu(local_dtype):
    # partial = decode(src) + local, then partial encoded: the fused kernel against the CPU's
    # unfused sequence, every pair of input and output codecs, fp32 partial in place
    g = torch.Generator().manual_seed(3)
    combos = itertools.product([4, 8], [4, 8], [True, False], [4196, 3072, 1000])
    for in_bits, out_bits, sym, n in combos:
        group = 32 if in_bits == 4 else 256
        incoming = torch.randn(n, generator=g) * 3
        local = _special(n, seed=n).to(local_dtype)
        src = qcomm.codec.encode(incoming, in_bits, group, sym)
        want_partial = qcomm.codec.decode(src, n, in_bits, group, sym) + local.float()
        want = qcomm.codec.encode(want_partial, out_bits, group, not sym)
        in_place = local_dtype == torch.float32 and n == 3072
        loc = local.cuda()
        partial, dst = _testing.cuda_codec_hop(
            src.cuda(), in_bits, group, sym, loc, out_bits, group, not sym, in_place=in_place
        )
        case = f"in={in_bits} out={out_bits} sym={sym} n={n} in_place={in_place}"
        if in_place:
            assert partial.data_ptr() == loc.data_ptr(), case
        assert same_floats(want_partial, partial.cpu()), f"{case}: partial sums differ"
        assert torch.equal(want, dst.cpu()), f"{case}: re-encoded bytes differ"
    # stochastic rounding of the re-encode, and group sizes that differ (the unfused sequence)
    x = torch.randn(2048, generator=g)
    local = torch.randn(2048, generator=g).to(local_dtype)
    salt = ref.noise_salt(7, 2, 1)
    for in_group, out_group, noise in [(128, 128, True), (64, 128, False)]:
        src = qcomm.codec.encode(x, 8, in_group, True)
        want_partial = qcomm.codec.decode(src, 2048, 8, in_group, True) + local.float()
        kw = dict(noise_salt=salt, noise_base=128) if noise else {}
        want = qcomm.codec.encode(want_partial, 4, out_group, False, **kw)
        partial, dst = _testing.cuda_codec_hop(
            src.cuda(), 8, in_group, True, local.cuda(), 4, out_group, False, **kw
        )
        assert same_floats(want_partial, partial.cpu()), (in_group, out_group, noise)
        assert torch.equal(want, dst.cpu()), (in_group, out_group, noise)


@pytest.mark.parametrize("bits,sym", [(4, True), (4, False), (8, True), (8, False)])
def test_cuda_decode_sum_matches_cpu(bits, sym):
    # two_step's owners' sum (gpu::decodeSum, 8 blocks per launch, later launches adding to the
    # first's sum): the CPU's decode and decodes with accumulate, in order, bit for bit; 1, 8, 9
    # and 17 blocks in one buffer at 16-byte offsets (the vector path) or one block 4 bytes off
    # (the scalar path), the output one float off (its scalar path), sizes from 1 to 2M + 77
    g = torch.Generator().manual_seed(bits + sym)
    group = 64 if bits == 4 else 128
    for count, n, skew in [
        (1, 1, 0),
        (8, 3, 0),
        (9, 1023, 0),
        (17, 4096 + 77, 4),
        (9, 2**21 + 77, 0),
    ]:
        blocks = [
            qcomm.codec.encode(
                _special(n, seed=k) if k % 3 == 0 else torch.randn(n, generator=g), bits, group, sym
            )
            for k in range(count)
        ]
        want = qcomm.codec.decode(blocks[0], n, bits, group, sym)
        for b in blocks[1:]:
            want = want + qcomm.codec.decode(b, n, bits, group, sym)
        unit = (blocks[0].numel() + 15) // 16 * 16 + 16
        offsets = [k * unit + (skew if k == count - 1 else 0) for k in range(count)]
        buffer = torch.zeros(count * unit + 16, dtype=torch.uint8)
        for off, b in zip(offsets, blocks):
            buffer[off : off + b.numel()] = b
        store = torch.full((n + 1,), 7.0, device="cuda")
        got = _testing.cuda_codec_decode_sum(
            buffer.cuda(), offsets, n, bits, group, sym, out=store[1:]
        )
        case = f"count={count} n={n} skew={skew}"
        assert got.data_ptr() == store[1:].data_ptr(), case
        assert same_floats(want, got.cpu()), f"{case}: sums differ"
        assert store[0].item() == 7.0, f"{case}: wrote before its output"
    with pytest.raises(ValueError, match="no block to sum"):
        _testing.cuda_codec_decode_sum(
            torch.zeros(64, dtype=torch.uint8, device="cuda"), [], 4, bits, group, sym
        )
    with pytest.raises(ValueError, match="multiple of 4 bytes"):
        _testing.cuda_codec_decode_sum(
            torch.zeros(4096, dtype=torch.uint8, device="cuda"), [2], 4, bits, group, sym
        )
    # a block two bytes into its buffer: refused, not a misaligned load on the GPU
    enc = qcomm.codec.encode(torch.randn(256, device="cuda"), bits, group, sym)
    skewed = torch.zeros(enc.numel() + 2, dtype=torch.uint8, device="cuda")
    skewed[2:] = enc
    with pytest.raises(ValueError, match="multiple of 4 bytes"):
        qcomm.codec.decode(skewed[2:], 256, bits, group, sym)


def test_cuda_divide_matches_cpu():
    # AVG's division of the owner's sum (gpu::divide, an IEEE fp32 division as the CPU's): world
    # sizes 2..8 over values with every special case; the reference divides element by element
    # (a tensor divisor: a scalar one may become a multiplication by its reciprocal)
    x = _special(5000, seed=11)
    for world in range(2, 9):
        got = _testing.cuda_codec_divide(x.cuda(), world)
        assert same_floats(x / torch.full_like(x, world), got.cpu()), f"world={world}"
