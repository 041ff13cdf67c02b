"""The codec of qnccl's wire, on tensors: what a quantized collective sends, byte for byte.

``encode`` gives the bytes a phase of ``bits`` sends for a tensor (per group of ``group_size``
elements: an fp32 scale, and a midpoint unless ``symmetric``, then the codes; the layout is in
docs/error-model.md), and ``decode`` gives back the fp32 values every rank reads from them. The
same functions run on CPU tensors (the CPU loops of the instruction set :func:`qcomm.cpu_isa`
names; :func:`qcomm.set_cpu_isa` switches) and on CUDA tensors (the CUDA kernels, on the current
stream), with the same bits. ``decode_sum`` and ``ring_hop`` are the two fused steps of the
schedules (two_step's sum of the ranks' copies, a ring's hop), for timing them.

``bits`` is 8 or 4, or 0 for none (the values travel in their dtype, as a phase of ``None``
does); ``group_size`` a power of two from 32 to 1024. A bad value raises ``ValueError``.
"""

from __future__ import annotations

import torch

from . import _C

__all__ = ["encoded_bytes", "encode", "decode", "decode_sum", "ring_hop"]


def encoded_bytes(
    numel: int, bits: int, group_size: int = 128, symmetric: bool = False, dtype=torch.float32
) -> int:
    """Bytes of the encoded block of `numel` elements: what :func:`encode` returns and a phase
    of `bits` sends for them (`dtype` matters for bits 0 only)."""
    return int(_C.encoded_bytes(numel, bits, group_size, symmetric, dtype))


def encode(
    x: torch.Tensor,
    bits: int,
    group_size: int = 128,
    symmetric: bool = False,
    *,
    rotate: bool = False,
    noise_salt: int | None = None,
    noise_base: int = 0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The wire bytes (a 1-D uint8 tensor on x's device) of `x`, read flat, fp32, fp16 or bf16.

    rotate: Hadamard-rotate each group first, as a rotated phase does (CPU; numel a multiple of
    group_size). noise_salt: stochastic rounding, element i's noise drawn from (noise_salt,
    noise_base + i) as the schedules draw it; None rounds to nearest. out: a contiguous uint8 CPU
    tensor of :func:`encoded_bytes` to write into instead of a new one (CPU)."""
    return _C.codec_encode(x, bits, group_size, symmetric, noise_salt, noise_base, rotate, out)


def decode(
    data: torch.Tensor,
    numel: int,
    bits: int,
    group_size: int = 128,
    symmetric: bool = False,
    dtype=torch.float32,
    *,
    rotate: bool = False,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    streamed: bool = False,
) -> torch.Tensor:
    """The fp32 values (1-D, on data's device) of `numel` elements that :func:`encode` gave
    `data` for; `dtype` is the encoded tensor's (it matters for bits 0 only).

    rotate: the bytes of a rotated encode, each group rotated back (CPU). out: a contiguous fp32
    tensor of numel elements to write into; accumulate: add the decoded values to out instead.
    streamed: write out with non-temporal stores, as the gather phase decodes a result of 8 MiB
    and more (CPU; neither rotate nor accumulate)."""
    return _C.codec_decode(
        data, numel, bits, group_size, symmetric, dtype, rotate, out, accumulate, streamed
    )


def decode_sum(
    blocks: list,
    numel: int,
    bits: int,
    group_size: int = 128,
    symmetric: bool = False,
    dtype=torch.float32,
    *,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
) -> torch.Tensor:
    """The fp32 sum, in list order, of the decoded values of several encoded blocks of `numel`
    elements (uint8 CPU tensors), in one pass: two_step's sum of the ranks' copies of a chunk.
    The same bits as decoding each and adding them in order. out and accumulate as in
    :func:`decode`."""
    return _C.codec_decode_sum(
        list(blocks), numel, bits, group_size, symmetric, dtype, out, accumulate
    )


def ring_hop(
    data: torch.Tensor,
    local: torch.Tensor,
    bits: int,
    out_bits: int | None = None,
    group_size: int = 128,
    symmetric: bool = False,
    *,
    noise_salt: int | None = None,
    noise_base: int = 0,
    partial_out: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> tuple:
    """One hop of the ring schedules, fused: the partial sum ``decode(data) + local`` (fp32) and
    its encoding at `out_bits` (default `bits`) for the next rank. Returns (partial, encoded).
    `data` was encoded at `bits` from a tensor of local's numel and dtype; CPU or CUDA tensors
    (local's device). noise_salt and noise_base as in :func:`encode`; partial_out and out: CPU
    tensors to write into instead of new ones."""
    return _C.codec_ring_hop(
        data,
        bits,
        local,
        bits if out_bits is None else out_bits,
        group_size,
        symmetric,
        noise_salt,
        noise_base,
        partial_out,
        out,
    )
