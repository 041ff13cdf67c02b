"""W qnccl ranks inside one process, one thread each, over real Gloo backends and a HashStore.

Gloo tests run ranks as threads the same way. This is what makes property-based testing of the
algorithms affordable: no process start-up per example. Backend calls release the GIL, so the
ranks really run concurrently.
"""

from __future__ import annotations

import datetime
import threading

import torch.distributed as dist

import qcomm

_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}


class InProcGroup:
    """W qnccl backends over Gloo, one per rank; wrap(gloo) may stand between each and its Gloo
    backend (tests/algo/wire_cases.py records the wire through it)."""

    def __init__(self, world: int, timeout_s: float = 60.0, wrap=None):
        self.world = world
        store = dist.HashStore()
        timeout = datetime.timedelta(seconds=timeout_s)
        self.backends = [None] * world
        self.inner = [None] * world
        cfg = qcomm.QuantConfig(min_bytes=0).as_tuple()

        def make(r):
            gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), r, world, timeout)
            self.inner[r] = wrap(gloo) if wrap is not None else gloo
            self.backends[r] = qcomm._C.QncclBackend(r, world, timeout, self.inner[r], None, cfg)

        self.on_all(make)

    def on_all(self, fn):
        """Runs fn(rank) on one thread per rank; re-raises the first rank's error."""
        errors = [None] * self.world

        def run(r):
            try:
                fn(r)
            except BaseException as e:  # noqa: BLE001 - re-raised below with the rank
                errors[r] = e

        threads = [threading.Thread(target=run, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r, e in enumerate(errors):
            if e is not None:
                raise RuntimeError(f"in-process rank {r}: {e}") from e

    def set_config(self, cfg: qcomm.QuantConfig) -> None:
        for b in self.backends:
            b.set_config(cfg.as_tuple())

    def allreduce(self, xs, op: str = "sum"):
        """Allreduce copies of the per-rank tensors `xs`; returns the per-rank outputs."""
        outs = [x.clone() for x in xs]

        def run(r):
            o = dist.AllreduceOptions()
            o.reduceOp = _OPS[op]
            self.backends[r].allreduce([outs[r]], o).wait()

        self.on_all(run)
        return outs

    def stats(self, rank: int = 0) -> dict:
        return dict(self.backends[rank].stats())


_cache = {}


def group(world: int) -> InProcGroup:
    """A cached group per world size (creating Gloo meshes is the slow part)."""
    if world not in _cache:
        _cache[world] = InProcGroup(world)
    return _cache[world]
