"""What several test files share: the bitwise comparison of decoded values, the mark of a test
that needs a GPU, and running one of scripts/."""

import os
import subprocess
import sys

import pytest
import torch

import qcomm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HAVE_GPU = torch.cuda.is_available() and qcomm.compiled_with_cuda()

# Needs a CUDA device and the CUDA build: skipped without them; `-m cuda` selects these alone
# (scripts/gpu_check.sh). A list, for a module's pytestmark; `gpu` applies it to one test.
GPU_ONLY = [
    pytest.mark.cuda,
    pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA device and the CUDA build"),
]


def gpu(test):
    for mark in GPU_ONLY:
        test = mark(test)
    return test


def same_floats(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, the sign of zero included, except that a NaN matches any NaN (payloads differ
    between CPU and GPU)."""
    na, nb = torch.isnan(a), torch.isnan(b)
    if not torch.equal(na, nb):
        return False
    return torch.equal(a[~na], b[~nb]) and torch.equal(torch.signbit(a[~na]), torch.signbit(b[~nb]))


def run_script(script, *args, timeout=600, **env):
    """Runs bash scripts/<script> with `args` and the environment plus `env` (never under the
    sanitizers' LD_PRELOAD; PYTHON is this interpreter); returns (exit code, stdout + stderr)."""
    environ = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    environ.update(PYTHON=sys.executable, **env)
    run = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environ,
    )
    return run.returncode, run.stdout + run.stderr
