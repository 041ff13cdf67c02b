"""The call fingerprint (csrc/plan/plan.h planFingerprint) that the CUDA-IPC barrier compares
across ranks instead of exchanging plan headers on the host: equal calls must give equal
fingerprints on every rank, and a call that differs in anything its plan header holds, or in its
call number, must give another."""

import torch

import qcomm

fingerprint = qcomm.plan_fingerprint


def _cfg(**kw):
    return qcomm.QuantConfig(**{"min_bytes": 0, **kw})


def test_equal_calls_have_equal_fingerprints():
    a = fingerprint(1 << 20, torch.float32, _cfg(), call_seq=3)
    b = fingerprint(1 << 20, torch.float32, _cfg().encoded(), call_seq=3)  # or its encoded form
    assert a == b and 0 <= a < 2**32
    assert fingerprint(1 << 20) == fingerprint(1 << 20, torch.float32, qcomm.QuantConfig())


def test_every_field_of_the_call_changes_the_fingerprint():
    base = dict(config=_cfg(), numel=1 << 20, dtype=torch.float32, average=False, call_seq=3)
    changes = {
        "numel": dict(numel=(1 << 20) + 1),
        "dtype": dict(dtype=torch.bfloat16),
        "op": dict(average=True),
        "call number": dict(call_seq=4),
        "algorithm": dict(config=_cfg(algorithm="ring")),
        "reduce-phase bits": dict(config=_cfg(rs_bits=4)),
        "gather-phase bits": dict(config=_cfg(ag_bits=4)),
        "group size": dict(config=_cfg(group_size=64)),
        "symmetric": dict(config=_cfg(symmetric=True)),
        "rotation": dict(config=_cfg(rotate=True)),
        "stochastic rounding": dict(config=_cfg(stochastic_rounding=True)),
        "microshards": dict(config=_cfg(microshards=8)),
    }
    want = fingerprint(**base)
    seen = {want: "base"}
    for what, change in changes.items():
        got = fingerprint(**{**base, **change})
        assert got != want, what
        assert got not in seen, (what, seen[got])  # and none collides with another change here
        seen[got] = what
