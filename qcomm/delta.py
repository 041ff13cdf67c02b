"""Weight-difference all-gathers (issue 49, its second part): ZeRO-1/2 style training, where every
rank keeps the full weights and gathers the updated shards into them each step, sends each
shard's difference from the value every rank already holds, quantized, and every rank adds the
decoded differences to its buffer.

The value every rank holds of a shard is the decoded one, the owner's own slot too, so the next
difference (the owner's new weights less its slot) carries this step's quantization error along:
the error of one step is sent with the next and never accumulates. Every rank adds the same
decoded bytes to the same bits, so every rank holds the same bits after every call.

Before trusting the buffer the ranks check it: each rank keeps a checksum of the buffer as its
last call left it, and every call first gathers every rank's "unchanged since my last call"
and checksum (16 bytes a rank, exact). If any rank's buffer changed (an optimizer wrote to it, a
checkpoint was loaded), a rank has no state (it restarted, or this is the first call), or the
checksums differ, every rank gathers the full shards instead, exactly (their bytes as uint8,
which every group passes through: 4 bytes a parameter in fp32, once), never a wrong sum;
``fallbacks`` counts those calls. Exact matters at the first call: a model that starts from
4-bit weights trains from a different start (examples/zero1.py: +0.48% final loss, against
+0.08% with an exact first gather).

Memory: beyond the caller's buffer (the owner's decoded slot is in it), one
difference and the gathered differences (a shard and the buffer's size again), kept from call
to call. Time: two sums of the buffer's words each call (the checksums).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from . import _C, training


def _checksum(t: torch.Tensor) -> int:
    """The sum of the buffer's words (its floats' bits as integers) modulo 2^64: any change of
    one element changes it; at memory speed (a CRC-32 took 5x longer at 50 MB)."""
    b = t.detach().view(torch.uint8)
    whole = b.numel() // 8 * 8  # 8-byte words, summed as torch sums int64 (vectorized)
    return int(b[:whole].view(torch.int64).sum()) + int(b[whole:].to(torch.int64).sum())


class DeltaAllGather:
    """All-gathers shards into `full` (a contiguous 1-D buffer of W shards, this rank's at slot
    `rank`; every rank passes its own buffer of the same size) by their differences from what the
    buffer holds. Call it with this rank's new shard on every rank of `group`, as an all-gather."""

    def __init__(self, full: torch.Tensor, group=None):
        if full.dim() != 1 or not full.is_contiguous():
            raise ValueError("qcomm.delta: the buffer must be a contiguous 1-D tensor")
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if full.numel() % self.world:
            raise ValueError(
                f"qcomm.delta: the buffer's {full.numel()} elements are not W={self.world} shards"
            )
        self.full = full
        self.crc = None  # the buffer's checksum as this rank's last call left it
        self.calls = 0
        self.fallbacks = 0
        self.sent_bytes = 0  # the caller's bytes given to difference calls (input, not wire)
        self._diff = self._gathered = None
        training.register(self)

    def stats(self) -> dict:
        """Its part of qcomm.stats(group)["training"] (the buffer is the caller's)."""
        kept = [t for t in (self._diff, self._gathered) if t is not None]
        return {"delta_buffers": 1, "delta_calls": self.calls, "delta_fallbacks": self.fallbacks,
                "kept_bytes": sum(t.numel() * t.element_size() for t in kept)}  # fmt: skip

    def slot(self, rank: int) -> torch.Tensor:
        """The buffer's slot of `rank`'s shard (a view)."""
        n = self.full.numel() // self.world
        return self.full[rank * n : (rank + 1) * n]

    def _trusted(self) -> bool:
        """Whether every rank's buffer is as its last call left it, and all alike."""
        mine = _checksum(self.full)
        ok = self.crc is not None and mine == self.crc
        votes = torch.tensor([int(ok), mine], dtype=torch.int64)
        every = torch.empty(2 * self.world, dtype=torch.int64)
        dist.all_gather_into_tensor(every, votes, group=self.group)
        every = every.view(self.world, 2)
        fresh = [r for r in range(self.world) if not every[r, 0]]
        differ = not bool((every[:, 1] == every[0, 1]).all())
        if (fresh or differ) and _C.setting("QCOMM_DEBUG")["text"] in ("INFO", "CHECK"):
            why = f"rank(s) {fresh} have no state or a changed buffer" if fresh else ""
            why += ("; " if why else "") + ("the buffers' checksums differ" if differ else "")
            print(
                f"[qcomm rank {self.rank}/{self.world}] INFO difference all-gather of "
                f"{self.full.numel()} elements: the full shards, exactly ({why})",
                file=sys.stderr,
                flush=True,
            )
        return not fresh and not differ

    def __call__(self, shard: torch.Tensor) -> bool:
        """Gathers every rank's `shard` into the buffer; returns whether it sent differences
        (False: the full shards, a fallback)."""
        own = self.slot(self.rank)
        if shard.numel() != own.numel() or shard.dtype != self.full.dtype:
            raise ValueError(
                f"qcomm.delta: a shard of {shard.numel()} {shard.dtype} elements, the buffer's "
                f"slots hold {own.numel()} {self.full.dtype}"
            )
        self.calls += 1
        if self._trusted():
            if self._diff is None:  # kept from call to call: no fresh pages to fault in
                self._diff = torch.empty_like(own)
                self._gathered = torch.empty_like(self.full)
            diff = torch.sub(shard.reshape(-1), own, out=self._diff)
            dist.all_gather_into_tensor(self._gathered, diff, group=self.group)
            self.full.add_(self._gathered)
            self.sent_bytes += diff.numel() * diff.element_size()
            delta = True
        else:
            # the full shards, exactly: their bytes, which every group passes through (Gloo
            # gathers no int16, so bytes rather than words)
            mine = shard.reshape(-1).contiguous().view(torch.uint8)
            dist.all_gather_into_tensor(self.full.view(torch.uint8), mine, group=self.group)
            self.fallbacks += 1
            delta = False
        self.crc = _checksum(self.full)
        return delta


class FSDPDeltaAllGather:
    """An FSDP2 custom all-gather by differences, one per module (opt-in):
    ``module.set_custom_all_gather(FSDPDeltaAllGather())``. FSDP2 frees a module's unsharded
    parameters after use, so this object keeps its own reference copy: the module's last gathered
    flat parameters (one unsharded copy of the module's parameters per rank, in their all-gather
    dtype: 4 bytes a parameter in fp32), and gathers each call's shards as differences from it
    (:class:`DeltaAllGather`, with its checks and its exact fallback), then copies it into FSDP2's
    output. The group is FSDP2's (its mesh's), quantizing all-gathers at its ``ag_bits``. A
    non-float all-gather input (FSDP2's uint8 packing of mixed dtypes) is gathered as FSDP2 would,
    exactly."""

    def __init__(self):
        self.gather: DeltaAllGather | None = None
        self.reference: torch.Tensor | None = None
        self.calls = 0

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """FSDP2's all-gather output buffer (a plain tensor)."""
        return torch.empty(*size, dtype=dtype, device=device)

    def nbytes(self) -> int:
        """The bytes this object keeps: the reference copy and the difference buffers."""
        kept = [self.reference]
        if self.gather is not None:
            kept += [self.gather._diff, self.gather._gathered]
        return sum(t.numel() * t.element_size() for t in kept if t is not None)

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        self.calls += 1
        if not output_tensor.is_floating_point():
            return dist.all_gather_into_tensor(
                output_tensor, input_tensor, group=group, async_op=async_op
            )
        out = output_tensor.view(-1)
        ref = self.reference
        if ref is None or ref.numel() != out.numel() or ref.dtype != out.dtype:
            # a new layout: a new reference, whose first call gathers the full shards exactly
            self.reference = torch.zeros_like(out)
            self.gather = DeltaAllGather(self.reference, group)
        self.gather(input_tensor.reshape(-1))
        out.copy_(self.reference)
        return None
