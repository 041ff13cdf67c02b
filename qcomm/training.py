"""What the training-state objects of qcomm.feedback and qcomm.delta hold, per process group, for
qcomm.stats(group)["training"]: each object registers itself here (weakly: a dropped object
drops out) and says which group its calls ran on."""

from __future__ import annotations

import weakref

import torch.distributed as dist

_LIVE: weakref.WeakSet = weakref.WeakSet()


def register(obj) -> None:
    """Count `obj` (an object with .group, .stats()) in its group's training stats."""
    _LIVE.add(obj)


def same_group(a, b) -> bool:
    """Whether two group arguments name one group (None: the default group)."""
    default = dist.distributed_c10d._get_default_group()
    return (a if a is not None else default) is (b if b is not None else default)


def stats(group=None) -> dict:
    """The sum over the live objects whose calls ran on `group`: feedback_tensors (tensors whose
    error is kept), feedback_error_norm (the L2 norm of all those errors), delta_buffers,
    delta_calls, delta_fallbacks (calls that gathered the full shards), kept_bytes (what they
    all keep)."""
    out = {
        "feedback_tensors": 0,
        "feedback_error_norm": 0.0,
        "delta_buffers": 0,
        "delta_calls": 0,
        "delta_fallbacks": 0,
        "kept_bytes": 0,
    }
    sq = 0.0
    for obj in list(_LIVE):
        if getattr(obj, "group", False) is False or not same_group(obj.group, group):
            continue
        for k, v in obj.stats().items():
            if k == "feedback_error_sq":
                sq += v
            else:
                out[k] += v
    out["feedback_error_norm"] = sq**0.5
    return out
