"""The build: where nvcc and a CUDA build of torch are present (CI has both, without a GPU), the
CUDA kernels must have been compiled, for sm_80 and sm_90."""

import os

import pytest
import torch
from torch.utils import cpp_extension

import qcomm

HAVE_NVCC = cpp_extension.CUDA_HOME is not None and torch.version.cuda is not None


@pytest.mark.skipif(not HAVE_NVCC, reason="no nvcc or no CUDA build of torch: CPU-only build")
def test_cuda_sources_compiled_when_nvcc_is_present():
    if os.environ.get("QCOMM_CUDA") == "0":
        pytest.skip("QCOMM_CUDA=0 asked for a CPU-only build")
    assert qcomm.compiled_with_cuda()
    assert hasattr(qcomm._C, "cuda_codec_encode")
    wanted = {int(a) for a in os.environ.get("QCOMM_CUDA_ARCHS", "80;90").split(";") if a}
    assert wanted <= set(qcomm._C.cuda_archs()), qcomm._C.cuda_archs()


def test_cpu_build_reports_no_archs_without_cuda():
    if not qcomm.compiled_with_cuda():
        assert qcomm._C.cuda_archs() == []
    else:
        assert all(a >= 70 for a in qcomm._C.cuda_archs())
