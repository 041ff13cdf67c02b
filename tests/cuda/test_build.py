"""The build: where nvcc and a CUDA build of torch are present (CI has both, without a GPU), the
CUDA kernels must have been compiled, for sm_80 and sm_90."""

import glob
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch.utils import cpp_extension

import qcomm
import qcomm._testing

HAVE_NVCC = cpp_extension.CUDA_HOME is not None and torch.version.cuda is not None


@pytest.mark.skipif(not HAVE_NVCC, reason="no nvcc or no CUDA build of torch: CPU-only build")
def test_cuda_sources_compiled_when_nvcc_is_present():
    if os.environ.get("QCOMM_CUDA") == "0":
        pytest.skip("QCOMM_CUDA=0 asked for a CPU-only build")
    assert qcomm.compiled_with_cuda()
    assert hasattr(qcomm._testing, "cuda_codec_hop")  # the CUDA hooks, built with CUDA
    wanted = {int(a) for a in os.environ.get("QCOMM_CUDA_ARCHS", "80;90").split(";") if a}
    assert wanted <= set(qcomm._C.cuda_archs()), qcomm._C.cuda_archs()


def test_cpu_build_reports_no_archs_without_cuda():
    if not qcomm.compiled_with_cuda():
        assert qcomm._C.cuda_archs() == []
    else:
        assert all(a >= 70 for a in qcomm._C.cuda_archs())


def _cuobjdump_available() -> bool:
    if not HAVE_NVCC:
        return False
    if os.path.exists(os.path.join(cpp_extension.CUDA_HOME, "bin", "cuobjdump")):
        return True
    if shutil.which("cuobjdump"):
        return True
    try:
        import triton
    except ImportError:
        return False
    nvidia = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    return bool(glob.glob(os.path.join(nvidia, "cuobjdump")))


@pytest.mark.skipif(not _cuobjdump_available(), reason="no nvcc or no cuobjdump")
def test_sass_counts_reads_the_slab_encoder_probe():
    """benchmarks/sass_counts.py (static SASS counts, cited in benchmarks/HISTORY.md) still
    compiles its probe of encodeSlab and parses the disassembly: one row per bit width and
    symmetry, each with the shuffles of the reduction and the stores of the codes."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(
        [sys.executable, os.path.join(root, "benchmarks", "sass_counts.py")],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| encodeSlabProbe")]
    assert len(rows) == 4, out
    for cells in rows:
        total, shfl, stg = int(cells[2]), int(cells[3]), int(cells[-2])
        assert total > 0 and shfl > 0 and stg > 0, out


@pytest.mark.skipif(not HAVE_NVCC, reason="no nvcc or no CUDA build of torch: CPU-only build")
def test_codec_timing_compiles():
    """benchmarks/cuda/codec_timing.cu (the codec kernels timed without torch, built here and
    carried to a GPU machine) still compiles against the kernels' launch API, with the flags of
    scripts/codec_timing.sh (--check: the harness alone; linking the kernels takes ~50 s more)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # nvcc not under another sanitizer's preloaded runtime (scripts/sanitize.sh sets LD_PRELOAD;
    # nvcc crashes under it)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["CUDA_HOME"] = cpp_extension.CUDA_HOME
    done = subprocess.run(
        ["bash", os.path.join(root, "scripts", "codec_timing.sh"), "--check"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "the harness compiles" in done.stdout, done.stdout
