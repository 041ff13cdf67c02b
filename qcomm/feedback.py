"""Error feedback for quantized gradients (issue 49, its first part): what a rank's encoding of
its gradients lost in one call is kept and added to what it sends the next time for the same
tensor, so that the error of a step is paid back in the next one instead of being lost (1-bit
Adam, EF21, DoubleSqueeze; PowerSGD's DDP hook keeps its error per bucket the same way).

State belongs to a tensor's role, held by the object that knows the role:

* :class:`DDPErrorFeedback`, the state of a DDP comm hook (:func:`ddp_hook`): the error per
  bucket index, of both phases of the allreduce it runs as a quantized reduce-scatter and a
  quantized all-gather: each rank's contribution (reduce phase) and the owner's sum (gather
  phase).
* :class:`FSDPErrorFeedback`, an FSDP2 custom reduce-scatter (one per module:
  ``module.set_custom_reduce_scatter(FSDPErrorFeedback())``): the error of the module's gradient
  reduce-scatter (its reduce phase; the output stays sharded).

The error of the reduce phase is computed as the codec computes it: the message this rank sends
is ``x + e``, and two_step's reduce phase delivers, of this rank's contribution to chunk c, its
exact values where c is this rank's own chunk and the decoded bytes of its encoding elsewhere
(``qcomm.reference.reduce_scatter``), so the new ``e`` is ``x + e`` less that. The gather phase's
error is the owner's sum less its own slot of the all-gather's result (every rank's copy of it).
Both need the plan to be known when the call is issued: the group runs ``algorithm="two_step"``
(never ``auto``, whose tuner may choose another schedule), with stochastic rounding off. A call
the plan passes through exactly (below ``min_bytes``) has no error, and keeps none.

Memory, per rank: for the reduce phase the error and the message buffer, fp32 (8 bytes per
parameter), and the codec's scratch of one shard; for the gather phase the owner's shard's
error (4 / W bytes per parameter). ``nbytes()`` says what an object keeps.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from . import codec, training
from .config import QuantConfig


def _rows(message: torch.Tensor, world: int) -> list:
    """The W shards of a sharded message (torch's: equal, contiguous)."""
    return list(message.view(world, -1))


def _kept(scratch: dict, key: str, n: int, dtype=torch.uint8, zeros=False) -> torch.Tensor:
    """scratch[key], n elements of dtype, kept from call to call (made anew when n changes)."""
    t = scratch.get(key)
    if t is None or t.numel() != n:
        t = scratch[key] = (torch.zeros if zeros else torch.empty)(n, dtype=dtype)
    return t


def reduce_error(
    sent: torch.Tensor, world: int, rank: int, plan: dict, cfg: QuantConfig, out=None, scratch=None
):
    """What two_step's reduce phase loses of this rank's `sent` (a message of W shards, this
    rank's contribution), in fp32: zero in this rank's own shard (the owner adds its own values
    exactly), elsewhere each shard less the decoded bytes of its encoding at plan["rs_bits"]
    (groups counted from the shard's start; rotated when the plan rotates). Into `out` (fp32,
    sent's numel) when given; `scratch`: a dict of buffers kept from call to call."""
    err = out if out is not None else torch.empty(sent.numel(), dtype=torch.float32)
    scratch = {} if scratch is None else scratch
    bits = (plan["rs_bits"] or 0) if plan["quantize"] else 0
    if bits == 0:
        return err.zero_()
    g, sym, rotate = cfg.group_size, cfg.symmetric, plan["rotate"]
    rows, errs = sent.reshape(world, -1), err.view(world, -1)
    n = rows.shape[1]
    padded = -(-n // g) * g if rotate else n  # a rotated shard: whole groups, zeros after
    for c in range(world):
        if c == rank:
            errs[c].zero_()  # the owner's own values are added exactly
            continue
        x = rows[c]
        if padded != n:
            pad = _kept(scratch, "pad", padded, sent.dtype, zeros=True)
            pad[:n] = x
            x = pad
        size = codec.encoded_bytes(padded, bits, g, sym, dtype=sent.dtype)
        data = codec.encode(x, bits, g, sym, rotate=rotate, out=_kept(scratch, "bytes", size))
        if padded != n:
            got = _kept(scratch, "decoded", padded, torch.float32)
            codec.decode(data, padded, bits, g, sym, dtype=sent.dtype, rotate=rotate, out=got)
            errs[c].copy_(got[:n])
        else:
            codec.decode(data, n, bits, g, sym, dtype=sent.dtype, rotate=rotate, out=errs[c])
        torch.sub(rows[c], errs[c], out=errs[c])  # the shard less what its owner decodes
    return err


def _check(group, cfg: QuantConfig, what: str) -> None:
    if cfg.algorithm != "two_step" or cfg.stochastic_rounding:
        raise ValueError(
            f"qcomm.feedback: {what} needs its group to run algorithm='two_step' with "
            f"stochastic_rounding off (the error it keeps is two_step's, known when the call is "
            f"issued); the group has algorithm={cfg.algorithm!r}, "
            f"stochastic_rounding={cfg.stochastic_rounding}"
        )


class ReduceFeedback:
    """The error of one tensor's reduce phase, kept between calls: :meth:`compensate` returns the
    message to send (the tensor plus the error kept) and keeps the new error. The message's
    numel must stay the same from call to call (a different one starts again from zero). The
    message is a buffer the object keeps: valid until its next call."""

    def __init__(self):
        self.error: Optional[torch.Tensor] = None
        self._want: Optional[torch.Tensor] = None
        self._scratch: dict = {}
        self.group = False  # the group of its last call (False: none yet)
        training.register(self)

    def stats(self) -> dict:
        """Its part of qcomm.stats(group)["training"]."""
        sq = 0.0 if self.error is None else float(self.error.double().square().sum())
        return {"feedback_tensors": int(self.error is not None), "feedback_error_sq": sq,
                "kept_bytes": self.nbytes()}  # fmt: skip

    def compensate(self, x: torch.Tensor, group, plan: dict, cfg: QuantConfig) -> torch.Tensor:
        """The message to send for `x` (its dtype, flat): x plus the error kept; keeps the error
        of sending it under `plan` (qcomm.plan's reduce-scatter plan of the message)."""
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        self.group = group
        flat = x.reshape(-1)
        if self.error is None or self.error.numel() != flat.numel():
            self.error = torch.zeros(flat.numel(), dtype=torch.float32, device=x.device)
            self._want = torch.empty_like(self.error)
        want = torch.add(flat, self.error, out=self._want)  # fp32
        sent = want if x.dtype == torch.float32 else want.to(x.dtype)
        # the new error: what was wanted less what the reduce phase will deliver of `sent`
        reduce_error(sent, world, rank, plan, cfg, out=self.error, scratch=self._scratch)
        if sent is not want:
            self.error.add_(want).sub_(sent.float())  # and the cast's rounding
        return sent

    def nbytes(self) -> int:
        """The bytes this object keeps: the error (fp32), the message buffer (fp32) and the
        codec's scratch of one shard."""
        kept = [self.error, self._want] + list(self._scratch.values())
        return sum(t.numel() * t.element_size() for t in kept if t is not None)


def _padded(x: torch.Tensor, world: int) -> torch.Tensor:
    n = -(-x.numel() // world) * world
    if n == x.numel():
        return x.reshape(-1)
    out = torch.zeros(n, dtype=x.dtype, device=x.device)
    out[: x.numel()] = x.reshape(-1)
    return out


class _Bucket:
    def __init__(self):
        self.reduce = ReduceFeedback()
        self.gather: Optional[torch.Tensor] = None  # the owner's sum's error, its shard


class DDPErrorFeedback:
    """The state of :func:`ddp_hook`: the error of every bucket (by its index), and the qnccl
    group its calls run on. ``group=None`` makes one over the default group's ranks with
    ``algorithm="two_step"``, reduce-scatters and all-gathers at `bits` and ``min_bytes=0``
    (construct it on every rank, as a process group is made); a given group must be qnccl with
    two_step, both options on and stochastic rounding off."""

    def __init__(self, group=None, bits: int = 4, group_size: int = 128):
        if group is None:
            cfg = QuantConfig(
                algorithm="two_step",
                rs_bits=bits,
                ag_bits=bits,
                group_size=group_size,
                reduce_scatter=True,
                all_gather=True,
                tune=False,
                min_bytes=0,
            )
            group = dist.new_group(backend="qnccl", pg_options=cfg)
        from . import get_config

        self.group = group
        self.config = get_config(group)
        _check(group, self.config, "DDPErrorFeedback")
        if not (self.config.reduce_scatter and self.config.all_gather):
            raise ValueError(
                "qcomm.feedback: DDPErrorFeedback's group must quantize reduce-scatters and "
                "all-gathers (QuantConfig(reduce_scatter=True, all_gather=True))"
            )
        self.buckets: dict = {}
        self.calls = 0
        training.register(self)

    def stats(self) -> dict:
        """Its part of qcomm.stats(group)["training"]: the gather phase's errors (each bucket's
        reduce phase counts itself)."""
        kept = [b.gather for b in self.buckets.values() if b.gather is not None]
        sq = sum(float(g.double().square().sum()) for g in kept)
        return {"feedback_tensors": len(kept), "feedback_error_sq": sq,
                "kept_bytes": sum(g.numel() * 4 for g in kept)}  # fmt: skip

    def nbytes(self) -> int:
        """The bytes of error this rank keeps (fp32)."""
        n = 0
        for b in self.buckets.values():
            n += b.reduce.nbytes() + (0 if b.gather is None else b.gather.numel() * 4)
        return n

    def residual_norms(self) -> dict:
        """{bucket index: (reduce error's L2 norm, gather error's L2 norm)} on this rank."""
        out = {}
        for i, b in self.buckets.items():
            r = 0.0 if b.reduce.error is None else float(b.reduce.error.norm())
            g = 0.0 if b.gather is None else float(b.gather.norm())
            out[i] = (r, g)
        return out

    def allreduce(self, x: torch.Tensor, key) -> torch.Tensor:
        """The average of `x` over the group's ranks, its two phases quantized with their errors
        fed back (the state of `key`); x is not written."""
        from . import plan as plan_of

        group, cfg = self.group, self.config
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        b = self.buckets.setdefault(key, _Bucket())
        message = _padded(x, world)
        rs_plan = plan_of(message, group=group, collective="reduce_scatter")
        sent = b.reduce.compensate(message, group, rs_plan, cfg)
        shard = torch.empty(message.numel() // world, dtype=x.dtype, device=x.device)
        dist.reduce_scatter_tensor(shard, sent, group=group)
        if b.gather is None or b.gather.numel() != shard.numel():
            b.gather = torch.zeros(shard.numel(), dtype=torch.float32, device=x.device)
        want = shard.float() + b.gather
        mine = want.to(x.dtype)
        full = torch.empty(message.numel(), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(full, mine, group=group)
        # every rank's copy of this rank's slot is what the gather delivered of `mine`
        b.gather = want - full.view(world, -1)[rank].float()
        self.calls += 1
        return full[: x.numel()].view_as(x).div_(world)


def ddp_hook(state: DDPErrorFeedback, bucket):  # no annotations: DDP checks them as objects
    """A DDP comm hook (``ddp.register_comm_hook(DDPErrorFeedback(), ddp_hook)``): each bucket's
    gradients averaged with 4-bit (the state's bits) reduce and gather phases and their errors
    fed back per bucket index. Runs when DDP hands it the bucket and returns a completed future
    (the calls are qnccl's, on its progress thread; the hook waits for them)."""
    grads = bucket.buffer()
    out = state.allreduce(grads, bucket.index())
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(out)
    return fut


class FSDPErrorFeedback:
    """An FSDP2 custom reduce-scatter with error feedback, one per module:
    ``module.set_custom_reduce_scatter(FSDPErrorFeedback())``. The module's reduce-scatter group
    (FSDP2's, from the mesh) must be qnccl with ``algorithm="two_step"``, ``reduce_scatter=True``
    and stochastic rounding off. It keeps the error of the module's reduce phase (4 bytes per
    unsharded parameter on every rank) and sends it with the module's next gradients."""

    def __init__(self):
        self.reduce = ReduceFeedback()
        self.calls = 0

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """FSDP2's buffer for the reduce-scatter's input (a plain tensor)."""
        return torch.empty(*size, dtype=dtype, device=device)

    def nbytes(self) -> int:
        """The bytes of error this module keeps on this rank (fp32)."""
        return self.reduce.nbytes()

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        from . import get_config
        from . import plan as plan_of

        cfg = get_config(group)
        _check(group, cfg, "FSDPErrorFeedback")
        plan = plan_of(input_tensor, op=op, group=group, collective="reduce_scatter")
        sent = self.reduce.compensate(input_tensor, group, plan, cfg)
        self.calls += 1
        return dist.reduce_scatter_tensor(
            output_tensor, sent.view_as(input_tensor), op=op, group=group, async_op=async_op
        )
