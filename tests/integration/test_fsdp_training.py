"""FSDP2 (fully_shard) training on a qnccl group with quantized gradient reduce-scatters matches
exact training on Gloo.

Runs examples/fsdp_train.py's training (examples/ddp_train.py's task and MLP with FSDP2 in place
of DDP: 2 ranks, each Linear and the root fully_shard'ed, 300 Adam steps, the same seed and data)
over Gloo and over
qnccl with QuantConfig(reduce_scatter=True) at 8 bits, min_bytes=0 (every gradient reduce-scatter
quantized). Gloo's reduce_scatter_tensor averages correctly on torch 2.11 (AVG, checked on 2
ranks), so FSDP2 on Gloo is the exact run.

Tolerances: the int8 run's final held-out MSE within 1% of the exact run's (the DDP test's); an
all-gather of the weights at 8 bits too, within 5%. Every rank ends with bit-identical full
parameters, and stats() counts a quantized reduce-scatter for each sharded module each step.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

import qcomm

from dist_util import run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import fsdp_train  # noqa: E402

STEPS = 300
LINEARS = 3  # each Linear reduce-scatters its gradients once a step (the root holds none)


def _cfg(**kw):
    return qcomm.QuantConfig(min_bytes=0, rotate=False, reduce_scatter=True, tune=False, **kw)


@pytest.fixture(scope="module")
def exact():
    return run_ranks(fsdp_train.train, 2, STEPS, backend="gloo", timeout=180)


def _check(res, exact, tol):
    for r in (exact, res):
        assert r[0]["digest"] == r[1]["digest"], "ranks ended with different parameters"
        start, final = r[0]["curve"][0][1], r[0]["final"]
        assert final < start / 6, f"training did not reduce the loss enough: {start} -> {final}"
    rel = res[0]["final"] / exact[0]["final"] - 1
    print(f"final MSE {res[0]['final']:.7f} vs exact {exact[0]['final']:.7f} ({rel:+.3%})")
    assert abs(rel) < tol, f"final loss {rel:+.2%} from exact"


def test_fsdp2_quantized_reduce_scatter_matches_exact(exact):
    quant = run_ranks(fsdp_train.train, 2, STEPS, pg_options=_cfg(), timeout=180)
    _check(quant, exact, 0.01)
    by = quant[0]["stats"]["by_collective"]
    assert by["reduce_scatter"]["quantized_calls"] == STEPS * LINEARS, by
    assert by["all_gather"]["quantized_calls"] == 0, by


@pytest.mark.large  # another 2-rank training run; the all-gather's own tests are in process
def test_fsdp2_quantized_all_gather_bf16(exact):
    cfg = _cfg(all_gather=True)
    quant = run_ranks(fsdp_train.train, 2, STEPS, 0, torch.bfloat16, pg_options=cfg, timeout=180)
    _check(quant, exact, 0.05)
    by = quant[0]["stats"]["by_collective"]
    assert by["reduce_scatter"]["quantized_calls"] > 0 and by["all_gather"]["quantized_calls"] > 0


def test_hsdp_replicate_dimension_on_qnccl():
    # 4 ranks: a (2, 2) mesh, the shard dimension on Gloo (exact reduce-scatters), the replicate
    # dimension on qnccl through backend_override with a QuantConfig: its allreduces quantized
    cfg = qcomm.QuantConfig(min_bytes=0, tune=False)
    steps = 40
    exact = run_ranks(fsdp_train.train, 4, steps, backend="gloo", timeout=240)
    hsdp = run_ranks(fsdp_train.train, 4, steps, 0, None, cfg, backend="gloo", timeout=240)
    assert len({r["digest"] for r in hsdp}) == 1, "ranks ended with different parameters"
    st = hsdp[0]["stats"]
    assert st["by_collective"]["all_reduce"]["quantized_calls"] >= steps, st
    rel = hsdp[0]["final"] / exact[0]["final"] - 1
    print(f"HSDP final MSE {hsdp[0]['final']:.5f} vs exact {exact[0]['final']:.5f} ({rel:+.2%})")
    assert abs(rel) < 0.02, f"final loss {rel:+.2%} from exact"
