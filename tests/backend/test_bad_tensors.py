"""Tensors Gloo mishandles get a clear error, or the right result, instead of a crash: an expanded
view (elements that overlap in memory, stride 0) is refused before anything is sent, on the
quantized path and on every pass-through; a non-contiguous view of a leaf that requires grad gets
its result in place, as Gloo gives it."""

import torch
import torch.distributed as dist

import qcomm

from dist_util import run_ranks


def _overlap_worker(rank, world):
    out = {}
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0))
    big = torch.ones(1).expand(4096)  # quantized if it were dense
    small = torch.ones(1).expand(16)  # passes through (an op other than SUM)
    calls = {
        "allreduce": lambda: dist.all_reduce(big),
        "allreduce_max": lambda: dist.all_reduce(small, op=dist.ReduceOp.MAX),
        "broadcast": lambda: dist.broadcast(small, 0),
        "all_gather_out": lambda: dist.all_gather([small, torch.ones(16)], torch.ones(16)),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(
            torch.ones(1).expand(32), torch.ones(16)
        ),
    }
    for name, call in calls.items():
        try:
            call()
            out[name] = "no error"
        except ValueError as e:
            out[name] = str(e)
    # the group still works afterwards
    x = torch.full((4096,), float(rank + 1))
    dist.all_reduce(x)
    out["after"] = float(x[0])
    return out


def test_overlapping_tensors_are_refused_before_anything_is_sent():
    for rank, out in enumerate(run_ranks(_overlap_worker, 2)):
        for name in ("allreduce", "allreduce_max", "broadcast", "all_gather_out"):
            msg = out[name]
            assert f"[qcomm rank {rank}/2]" in msg and "overlap in memory" in msg, (name, msg)
        assert "all_gather_into_tensor" in out["all_gather_into_tensor"], out
        assert abs(out["after"] - 3.0) < 0.05, out


def _requires_grad_view_worker(rank, world):
    results = {}
    for name, cfg in (("quantized", qcomm.QuantConfig(min_bytes=0)), ("exact", None)):
        if cfg is not None:
            qcomm.set_config(cfg)
        else:
            qcomm.set_config(qcomm.QuantConfig(algorithm="none"))
        w = torch.full((64, 64), float(rank + 1), requires_grad=True)
        view = w.t()  # non-contiguous, a view of a leaf that requires grad
        dist.all_reduce(view)
        results[name] = (float(w.detach().min()), float(w.detach().max()), w.requires_grad)
    return results


def test_a_view_of_a_leaf_that_requires_grad_gets_its_result_in_place():
    for out in run_ranks(_requires_grad_view_worker, 2):
        for name in ("quantized", "exact"):
            lo, hi, grad = out[name]
            assert abs(lo - 3.0) < 0.05 and abs(hi - 3.0) < 0.05 and grad, (name, out)
