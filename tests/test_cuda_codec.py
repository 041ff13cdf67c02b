"""The CUDA codec kernels against the CPU codec, bit for bit (DESIGN invariant 3). Runs where a
GPU is present (scripts/gpu_check.sh); skips elsewhere."""

import itertools

import pytest
import torch

import qcomm
from qcomm import _C
from qcomm import reference as ref

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and qcomm.compiled_with_cuda()),
    reason="needs a CUDA device and the CUDA build",
)


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
        cpu = _C.codec_encode(x, bits, group, sym)
        gpu = _C.cuda_codec_encode(x.cuda(), bits, group, sym).cpu()
        assert torch.equal(cpu, gpu), f"{name}: wire bytes differ"
        y_cpu = _C.codec_decode(cpu, x.numel(), bits, group, sym)
        y_gpu = _C.cuda_codec_decode(gpu.cuda(), x.numel(), bits, group, sym).cpu()
        same = torch.equal(torch.isnan(y_cpu), torch.isnan(y_gpu))
        same = same and torch.equal(y_cpu[~torch.isnan(y_cpu)], y_gpu[~torch.isnan(y_gpu)])
        assert same, f"{name}: decoded values differ"


@pytest.mark.parametrize("bits,sym", [(4, True), (8, False)])
def test_cuda_stochastic_matches_cpu(bits, sym):
    x = torch.randn(50000, generator=torch.Generator().manual_seed(1))
    salt = ref.noise_salt(9, 1, 0)
    cpu = _C.codec_encode(x, bits, 128, sym, noise_salt=salt, noise_base=4096)
    gpu = _C.cuda_codec_encode(x.cuda(), bits, 128, sym, noise_salt=salt, noise_base=4096)
    assert torch.equal(cpu, gpu.cpu())
