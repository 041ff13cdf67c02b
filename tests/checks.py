"""What several test files share: the bitwise comparison of decoded values, and the mark of a test
that needs a GPU."""

import pytest
import torch

import qcomm

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
