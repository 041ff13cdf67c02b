"""W qnccl ranks inside one process, one thread each, over real Gloo backends and a HashStore.

Gloo tests run ranks as threads the same way. This is what makes property-based testing of the
algorithms affordable: no process start-up per example. Backend calls release the GIL, so the
ranks really run concurrently.
"""

from __future__ import annotations

import datetime
import threading
import time

import torch
import torch.distributed as dist

import qcomm

_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}


def reduce_op(op: str, factor=None):
    """The ReduceOp of "sum", "avg", "max" or "premul" (PREMUL_SUM with `factor`)."""
    if op == "premul":
        return dist._make_nccl_premul_sum(factor)
    if op == "max":
        return dist.ReduceOp.MAX
    return _OPS[op]


class InProcGroup:
    """W qnccl backends over Gloo, one per rank; wrap(gloo) may stand between each and its Gloo
    backend (tests/algo/wire_cases.py records the wire through it)."""

    def __init__(self, world: int, timeout_s: float = 60.0, wrap=None):
        self.world = world
        store = dist.HashStore()
        timeout = datetime.timedelta(seconds=timeout_s)
        self.backends = [None] * world
        self.inner = [None] * world
        cfg = qcomm.QuantConfig(min_bytes=0).encoded()

        def make(r):
            gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), r, world, timeout)
            self.inner[r] = wrap(gloo) if wrap is not None else gloo
            self.backends[r] = qcomm._C.QncclBackend(r, world, timeout, self.inner[r], None, cfg)

        self.on_all(make)

    def on_all(self, fn, timeout=600.0):
        """Runs fn(rank) on one thread per rank; re-raises the first rank's error. A rank still
        running after `timeout` seconds fails the caller (a hang ends the test, bounded; its
        thread is left, a daemon)."""
        errors = [None] * self.world

        def run(r):
            try:
                fn(r)
            except BaseException as e:  # noqa: BLE001 - re-raised below with the rank
                errors[r] = e

        threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(self.world)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [r for r, t in enumerate(threads) if t.is_alive()]
        if stuck:
            raise TimeoutError(f"in-process rank(s) {stuck} still running after {timeout} s")
        for r, e in enumerate(errors):
            if e is not None:
                raise RuntimeError(f"in-process rank {r}: {e}") from e

    def set_config(self, cfg: qcomm.QuantConfig) -> None:
        for b in self.backends:
            b.set_config(cfg.encoded())

    def allreduce(self, xs, op: str = "sum"):
        """Allreduce copies of the per-rank tensors `xs`; returns the per-rank outputs."""
        outs = [x.clone() for x in xs]

        def run(r):
            o = dist.AllreduceOptions()
            o.reduceOp = _OPS[op]
            self.backends[r].allreduce([outs[r]], o).wait()

        self.on_all(run)
        return outs

    def reduce_scatter(self, xs, op: str = "sum", factor=None, in_place=False):
        """reduce_scatter_tensor of the per-rank 1-D inputs `xs` (left unchanged unless
        in_place: then each rank's output is its own shard of a copy of its input); returns the
        per-rank outputs."""
        world = self.world
        ins = [x.clone() for x in xs]
        n = xs[0].numel() // world
        outs = [
            ins[r].narrow(0, r * n, n) if in_place else torch.empty(n, dtype=xs[0].dtype)
            for r in range(world)
        ]

        def run(r):
            o = dist.ReduceScatterOptions()
            o.reduceOp = reduce_op(op, factor)
            self.backends[r]._reduce_scatter_base(outs[r], ins[r], o).wait()

        self.on_all(run)
        if not in_place:
            for x, y in zip(xs, ins):
                assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), "input changed"
        return [o.clone() for o in outs]

    def all_gather(self, xs, in_place=False):
        """all_gather_into_tensor of the per-rank 1-D shards `xs`; in_place: each rank's input
        is its own slot of the output (FSDP2's); returns the per-rank outputs."""
        world, n = self.world, xs[0].numel()
        outs = [torch.empty(world * n, dtype=xs[0].dtype) for _ in range(world)]
        ins = []
        for r in range(world):
            if in_place:
                outs[r].narrow(0, r * n, n).copy_(xs[r])
                ins.append(outs[r].narrow(0, r * n, n))
            else:
                ins.append(xs[r].clone())

        def run(r):
            o = torch._C._distributed_c10d.AllgatherOptions()
            self.backends[r]._allgather_base(outs[r], ins[r], o).wait()

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
