"""A pure-PyTorch model of the qcomm codec and of the three allreduce algorithms.

It documents the math and is what the tests compare the extension against. Two precisions, each
where it belongs:

* The codec and the algorithms are modelled **in fp32, operation for operation** as the C++ code
  (csrc/codec/codec.h, csrc/algo/*.cpp) performs them: the spec says the codec computes in fp32 with
  round-to-nearest-even, and only an fp32 model can say what the exact wire bytes are. torch's
  elementwise fp32 ops are correctly rounded IEEE operations, so the model and the extension agree
  bit for bit, and the tests demand exactly that.
* The **exact sum** the results are judged against, and the **error bound**, are float64.

Codec (per group of `group_size` consecutive elements; the last group may be shorter):

  symmetric:   scale = absmax / qmax                    (qmax = 127 at 8 bits, 7 at 4 bits)
               q = round(clamp(x / scale, -qmax, qmax)),    x^ = q * scale
  asymmetric:  scale = hi / L - lo / L,  mid = lo/2 + hi/2  (L = 255 at 8 bits, 15 at 4 bits)
               q = round(clamp((x - mid) / scale + L/2, 0, L)),   x^ = mid + (q - L/2) * scale

  round = nearest, ties to even; scale == 0 gives q = 0 (symmetric) or L/2 rounded (asymmetric),
  so constant groups decode exactly. A group with a NaN or Inf gets scale = NaN: all of it decodes
  to NaN.

Error bound of one quantization of a finite group: |x - x^| <= scale / 2, plus the fp32 rounding of
the computation of t and of x^ (a few ulps, bounded below). An allreduce's bound is the sum of the
bounds of every quantization an element's value passes through (each dequantized value is added
as is into the next partial sum), plus the fp32 rounding of the sums and of the final cast.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

import torch

F32 = torch.float32
F64 = torch.float64


@dataclasses.dataclass(frozen=True)
class Codec:
    bits: int  # 0 (raw, in raw_dtype), 4 or 8
    group_size: int = 128
    symmetric: bool = False
    raw_dtype: torch.dtype = torch.float32

    @property
    def qmax(self) -> float:
        return 127.0 if self.bits == 8 else 7.0

    @property
    def levels(self) -> float:
        return 255.0 if self.bits == 8 else 15.0


def _groups(x32: torch.Tensor, g: int) -> Tuple[torch.Tensor, int]:
    """[n] -> [ng, g], the last group padded with its own first element (which changes neither its
    min, max, absmax nor its finiteness)."""
    n = x32.numel()
    ng = (n + g - 1) // g
    pad = ng * g - n
    if pad:
        x32 = torch.cat([x32, x32[(ng - 1) * g].repeat(pad)])
    return x32.view(ng, g), n


def group_params(x32: torch.Tensor, c: Codec) -> Tuple[torch.Tensor, torch.Tensor]:
    """(scale, mid) per group, fp32, computed as csrc/codec/codec.h groupParams does."""
    xg, _ = _groups(x32, c.group_size)
    bad = torch.isnan((xg * 0.0).sum(dim=1))
    if c.symmetric:
        scale = xg.abs().amax(dim=1) / torch.tensor(c.qmax, dtype=F32)
        mid = torch.zeros_like(scale)
    else:
        lo = xg.amin(dim=1)
        hi = xg.amax(dim=1)
        L = torch.tensor(c.levels, dtype=F32)
        # + 0.0 turns -0 into +0, so the sign of a zero never depends on reduction order
        scale = (hi / L - lo / L) + 0.0
        mid = (lo * 0.5 + hi * 0.5) + 0.0
    scale = torch.where(bad, torch.full_like(scale, float("nan")), scale)
    mid = torch.where(bad, torch.zeros_like(mid), mid)
    return scale, mid


# ---- stochastic rounding noise (csrc/codec/codec.h Noise, hash32, noiseSalt, noiseAt) ----

_M32 = 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding uint32 values (products wrap mod 2^64; the low 32 bits
    are what the C++ keeps)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def _hash32_int(x: int) -> int:
    return int(_hash32(torch.tensor([x & _M32], dtype=torch.int64))[0])


def noise_salt(call_seq: int, rank: int, phase: int) -> int:
    """The salt of `rank`'s encodes in `phase` (0 reduce, 1 gather) of call number `call_seq`."""
    return _hash32_int(_hash32_int(call_seq) ^ ((rank * 2 + phase + 0x9E3779B9) & _M32))


def noise(salt: int, base: int, n: int) -> torch.Tensor:
    """u in [0, 1) (fp32, 24 random bits) for elements base..base+n-1 of the message."""
    i = torch.arange(base, base + n, dtype=torch.int64)
    h = _hash32(_hash32(i & _M32) ^ (i >> 32) ^ salt)
    return (h >> 8).to(F32) * 2.0**-24


def quantize(
    x32: torch.Tensor, c: Codec, noise_at: Optional[Tuple[int, int]] = None
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes (int32, as stored before packing: symmetric codes are signed), scale, mid. With
    noise_at = (salt, base), codes are rounded stochastically: floor(t + u)."""
    scale, mid = group_params(x32, c)
    n = x32.numel()
    s = scale.repeat_interleave(c.group_size)[:n]
    m = mid.repeat_interleave(c.group_size)[:n]
    nonzero = s != 0
    safe = torch.where(nonzero, s, torch.ones_like(s))
    if c.symmetric:
        t = torch.where(nonzero, x32 / safe, torch.zeros_like(x32))
        t = t.clamp(-c.qmax, c.qmax)
    else:
        t = torch.where(nonzero, (x32 - m) / safe, torch.zeros_like(x32)) + c.levels * 0.5
        t = t.clamp(0.0, c.levels)
    # a non-finite group stores code 0 everywhere; its NaN scale carries the verdict
    finite = ~torch.isnan(s)
    if noise_at is None:
        r = torch.round(t)
    else:
        hi = c.qmax if c.symmetric else c.levels
        r = torch.floor(t + noise(noise_at[0], noise_at[1], n)).clamp(max=hi)
        # groups whose scale is 0 keep their constant code
        const = torch.tensor(0.0 if c.symmetric else float(round(c.levels * 0.5)), dtype=F32)
        r = torch.where(nonzero, r, const.expand_as(r))
    q = torch.where(finite, r, torch.zeros_like(t)).to(torch.int32)
    return q, scale, mid


FLT_MAX = torch.finfo(F32).max


def _clamp_finite(v: torch.Tensor) -> torch.Tensor:
    """A finite group decodes to finite values (the rounded scale can put qmax * scale just above
    FLT_MAX); NaN stays NaN."""
    return torch.where(v > FLT_MAX, FLT_MAX, torch.where(v < -FLT_MAX, -FLT_MAX, v))


def dequantize(q: torch.Tensor, scale: torch.Tensor, mid: torch.Tensor, c: Codec) -> torch.Tensor:
    """x^ of codes q with their groups' scale (and mid, asymmetric), in fp32, clamped to finite as
    codec.h dequantizeOne does."""
    n = q.numel()
    s = scale.repeat_interleave(c.group_size)[:n]
    if c.symmetric:
        return _clamp_finite(q.to(F32) * s)
    m = mid.repeat_interleave(c.group_size)[:n]
    return _clamp_finite(m + (q.to(F32) - c.levels * 0.5) * s)


def encode_bytes(
    x: torch.Tensor, c: Codec, noise_at: Optional[Tuple[int, int]] = None
) -> torch.Tensor:
    """The wire bytes of x (any of fp32/fp16/bf16), laid out as csrc/codec/codec.h documents."""
    if c.bits == 0:
        return x.to(c.raw_dtype).contiguous().view(torch.uint8).flatten()
    x32 = x.to(F32).flatten()
    n = x32.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.uint8)
    q, scale, mid = quantize(x32, c, noise_at)
    meta = [scale] if c.symmetric else [scale, mid]
    meta_b = torch.cat([m.contiguous().view(torch.uint8) for m in meta])
    pad = (-meta_b.numel()) % 16
    if c.bits == 8:
        data = (q & 0xFF).to(torch.uint8)
    else:
        nib = (q & 0xF).to(torch.uint8)
        if n % 2:
            nib = torch.cat([nib, torch.zeros(1, dtype=torch.uint8)])
        data = nib[0::2] | (nib[1::2] << 4)
    return torch.cat([meta_b, torch.zeros(pad, dtype=torch.uint8), data])


def roundtrip(
    x: torch.Tensor, c: Codec, noise_at: Optional[Tuple[int, int]] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    """x^ (fp32) after one encode/decode with codec c, and the float64 bound on |x - x^| (a whole
    step instead of half of one with stochastic rounding)."""
    x32 = x.to(F32).flatten()
    if c.bits == 0:
        y = x32.to(c.raw_dtype).to(F32)
        return y, cast_bound(x32.to(F64), c.raw_dtype)
    q, scale, mid = quantize(x32, c, noise_at)
    y = dequantize(q, scale, mid, c)
    n = x32.numel()
    s = scale.repeat_interleave(c.group_size)[:n].to(F64)
    m = mid.repeat_interleave(c.group_size)[:n].to(F64)
    # scale / 2 from rounding to the nearest code; the fp32 evaluation of t and of x^ adds a few
    # ulps of the magnitudes involved (|x|, |mid|, L/2 * scale), bounded by 2^-21 of their sum;
    # 2^-10 * scale covers the clamp at the ends (scale itself is rounded); 2^-140 covers groups
    # whose scale is subnormal.
    half_range = (c.qmax if c.symmetric else c.levels * 0.5) * s
    steps = 0.5 if noise_at is None else 1.0
    bound = steps * s * (1 + 2.0**-10) + 2.0**-21 * (x32.abs().to(F64) + m.abs() + half_range)
    bound = bound + 2.0**-140
    return y, bound


def cast_bound(v64: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bound on |v - dtype(v)| for rounding to nearest (half an ulp, relative), plus the absolute
    half-ulp of the dtype's subnormals."""
    if dtype == torch.float32:
        return v64.abs() * 2.0**-24 + 2.0**-150
    if dtype == torch.bfloat16:
        return v64.abs() * 2.0**-8 + 2.0**-134
    return v64.abs() * 2.0**-11 + 2.0**-25


# ---- rotation (csrc/codec/codec.h hadamardGroup) ----


def hadamard(v: torch.Tensor, g: int) -> torch.Tensor:
    """H v per group of g (unnormalised Walsh-Hadamard, entries +-1), in the butterfly order of
    csrc/codec/codec.h, so the fp32 results match bit for bit. v: fp32, numel a multiple of g."""
    v = v.reshape(-1, g)
    h = 1
    while h < g:
        w = v.reshape(v.shape[0], g // (2 * h), 2, h)
        a, b = w[:, :, 0, :], w[:, :, 1, :]
        v = torch.stack([a + b, a - b], dim=2).reshape(-1, g)
        h *= 2
    return v.reshape(-1)


def rotate_forward(x: torch.Tensor, g: int) -> torch.Tensor:
    """H x per group of g, in fp32, the last group padded with zeros (what the rotated codec
    quantizes: csrc/codec/codec.h rotateGroupInto, on a message padded to whole groups)."""
    x32 = x.to(F32).flatten()
    pad = (-x32.numel()) % g
    return hadamard(torch.cat([x32, torch.zeros(pad, dtype=F32)]), g)


def rotate_inverse(y: torch.Tensor, g: int) -> torch.Tensor:
    """H y / g per group of g: the inverse of rotate_forward (codec.h unrotateGroupInto)."""
    return hadamard(y, g) * (1.0 / g)


def _group_sum(v64: torch.Tensor, g: int) -> torch.Tensor:
    """Each element replaced by the sum over its group (v64 padded to whole groups)."""
    return v64.reshape(-1, g).sum(1, keepdim=True).expand(-1, g).reshape(-1)


# ---- chunk geometry (csrc/plan/plan.cpp) ----


def chunk_elems(n: int, world: int, group_size: int) -> int:
    """Elements of each rank's chunk: whole groups, as the plan cuts them."""
    groups = (n + group_size - 1) // group_size
    return (groups + world - 1) // world * group_size


def chunks(n: int, world: int, group_size: int) -> List[slice]:
    """Chunk c of an n-element message, per rank c (empty past the end), as the plan's."""
    ce = chunk_elems(n, world, group_size)
    out = []
    for c in range(world):
        b = min(c * ce, n)
        out.append(slice(b, min(b + ce, n)))
    return out


# ---- algorithms ----


@dataclasses.dataclass
class Result:
    out: torch.Tensor  # what every rank holds afterwards, in the input dtype
    bound: torch.Tensor  # float64 per-element bound on |out - exact|
    exact: torch.Tensor  # float64 exact sum (or average)


class _Tracked:
    """An fp32 value together with the float64 bound on its error against the exact partial sum."""

    def __init__(self, v: torch.Tensor, b: torch.Tensor):
        self.v, self.b = v, b

    def add(self, other_v: torch.Tensor, other_b: torch.Tensor) -> "_Tracked":
        s = self.v + other_v
        # one fp32 rounding of the sum
        return _Tracked(s, self.b + other_b + s.abs().to(F64) * 2.0**-24)

    def hop(self, c: Codec, noise_at=None) -> "_Tracked":
        """Encode and decode with codec c (a transfer); noise_at = (salt, base) rounds
        stochastically."""
        y, b = roundtrip(self.v, c, noise_at)
        return _Tracked(y, self.b + b)


def _codecs(dtype, rs_bits, ag_bits, group_size, symmetric):
    rs = Codec(rs_bits or 0, group_size, symmetric, dtype)
    ag = Codec(ag_bits or 0, group_size, symmetric, dtype)
    return rs, ag


def _start(x: torch.Tensor) -> _Tracked:
    x32 = x.to(F32)
    return _Tracked(x32, torch.zeros(x32.shape, dtype=F64))


def allreduce(
    xs: Sequence[torch.Tensor],
    algorithm: str = "two_step",
    rs_bits: Optional[int] = 8,
    ag_bits: Optional[int] = 8,
    group_size: int = 128,
    symmetric: bool = False,
    average: bool = False,
    rotate: Optional[bool] = None,
    stochastic_seq: Optional[int] = None,
) -> Result:
    """The quantized allreduce of the per-rank 1-D tensors `xs` (all of one dtype and numel).
    rotate: as QuantConfig.rotate (None: on when a phase has 4 bits). stochastic_seq: round
    stochastically, as call number `stochastic_seq` of its group does."""
    if rotate is None:
        rotate = rs_bits == 4 or ag_bits == 4
    if rotate:
        return _allreduce_rotated(
            xs, algorithm, rs_bits, ag_bits, group_size, symmetric, average, stochastic_seq
        )
    world = len(xs)
    dtype = xs[0].dtype
    n = xs[0].numel()
    flat = [x.flatten() for x in xs]
    rs, ag = _codecs(dtype, rs_bits, ag_bits, group_size, symmetric)
    exact = torch.stack([x.to(F64) for x in flat]).sum(0)
    if average:
        exact = exact / world
    out = torch.empty(n, dtype=dtype)
    bound = torch.zeros(n, dtype=F64)
    for c, sl in enumerate(chunks(n, world, group_size)):
        if sl.stop <= sl.start:
            continue
        parts = [x[sl] for x in flat]
        nz = _noise_of(stochastic_seq, sl.start)
        s = _reduce_chunk(parts, c, algorithm, rs, nz)
        if average:
            v = s.v / float(world)
            s = _Tracked(v, s.b / world + v.abs().to(F64) * 2.0**-24)
        g = s.hop(ag, nz(c, 1))
        o = g.v.to(dtype)
        out[sl] = o
        bound[sl] = g.b + cast_bound(g.v.to(F64), dtype)
    # the fp32 sums' rounding (added per step above) is relative to partial sums; the final value
    # can be smaller than them, so also allow 2^-23 of the sum of magnitudes per rank
    mags = torch.stack([x.to(F64).abs() for x in flat]).sum(0)
    bound = bound + world * 2.0**-23 * mags / (world if average else 1)
    return Result(out, bound, exact)


def _noise_of(stochastic_seq: Optional[int], start: int):
    """nz(rank, phase): the (salt, base) of `rank`'s encode in `phase` of the chunk that starts at
    element `start` of the message, or None (round to nearest)."""

    def nz(rank, phase):
        if stochastic_seq is None:
            return None
        return (noise_salt(stochastic_seq, rank, phase), start)

    return nz


def _reduce_chunk(parts, c: int, algorithm: str, rs: Codec, nz) -> _Tracked:
    """The reduce half of `algorithm` for chunk c (owned by rank c): parts[r] is rank r's input of
    the chunk; returns the owner's fp32 sum with its bound (the allreduce's and the
    reduce-scatter's shared part). two_step: the owner's own values exact, then the other ranks'
    decoded copies in rank order; "two_step_quantized_own": every rank's copy decoded and summed in
    rank order, the owner's own too, as Flash Communication's all-to-all quantizes every slot
    (what the fused CUDA-IPC experiment, csrc/experiments/ipc_fused, computes)."""
    world = len(parts)
    if algorithm == "two_step":
        s = _start(parts[c])
        for r in range(world):
            if r != c:
                h = _start(parts[r]).hop(rs, nz(r, 0))
                s = s.add(h.v, h.b)
    elif algorithm == "two_step_quantized_own":
        s = _start(parts[0]).hop(rs, nz(0, 0))
        for r in range(1, world):
            h = _start(parts[r]).hop(rs, nz(r, 0))
            s = s.add(h.v, h.b)
    elif algorithm == "ring":
        # chunk c starts at rank c+1 and travels c+2, ..., ending at its owner c
        r0 = (c + 1) % world
        s = _start(parts[r0])
        for j in range(2, world + 1):
            s = s.hop(rs, nz((c + j - 1) % world, 0))
            s = s.add(parts[(c + j) % world].to(F32), 0.0)
    elif algorithm == "semi_ring":
        R, L = world // 2, (world - 1) // 2
        right = _chain(parts, [(c + d) % world for d in range(R, 0, -1)], rs, nz)
        s = right.add(parts[c].to(F32), 0.0)
        if L > 0:
            left = _chain(parts, [(c - d) % world for d in range(L, 0, -1)], rs, nz)
            s = s.add(left.v, left.b)
    else:
        raise ValueError(f"unknown algorithm {algorithm!r}")
    return s


def shards(n: int, world: int) -> List[slice]:
    """torch's shards of a sharded collective's n-element message: rank r's is [r*n/W, (r+1)*n/W)
    (csrc/plan/plan.cpp quantizedPlan, sharded calls); quantization groups start at each shard."""
    m = n // world
    return [slice(r * m, (r + 1) * m) for r in range(world)]


def reduce_scatter(
    xs: Sequence[torch.Tensor],
    algorithm: str = "two_step",
    rs_bits: int = 8,
    group_size: int = 128,
    symmetric: bool = False,
    op: str = "sum",
    factor: Optional[float] = None,
    stochastic_seq: Optional[int] = None,
    rotate: Optional[bool] = None,
) -> List[Result]:
    """The quantized reduce-scatter of the per-rank 1-D inputs `xs` (numel a multiple of W): one
    Result per rank, its shard. op: "sum", "avg" (the fp32 sum divided by W) or "premul" (the
    fp32 sum times float32(factor), never the tensor's dtype). rotate: as QuantConfig.rotate
    (None: on when rs_bits is 4; _reduce_scatter_rotated).

    Bound: the reduce half's (as the allreduce's: at most one quantization per value for
    two_step, the chain's hops for the rings), the scaling's fp32 rounding and the final cast; no
    gather term."""
    if rotate is None:
        rotate = rs_bits == 4
    if rotate:
        return _reduce_scatter_rotated(
            xs, algorithm, rs_bits, group_size, symmetric, op, factor, stochastic_seq
        )
    world = len(xs)
    flat = [x.flatten() for x in xs]
    dtype = flat[0].dtype
    rs = Codec(rs_bits or 0, group_size, symmetric, dtype)
    exact_all = torch.stack([x.to(F64) for x in flat]).sum(0)
    mags_all = torch.stack([x.to(F64).abs() for x in flat]).sum(0)
    f32 = None if factor is None else torch.tensor(factor, dtype=F32)
    out = []
    for c, sl in enumerate(shards(flat[0].numel(), world)):
        parts = [x[sl] for x in flat]
        exact = exact_all[sl]
        mags = mags_all[sl] * world * 2.0**-23
        if sl.stop <= sl.start:
            out.append(Result(torch.empty(0, dtype=dtype), exact.clone(), exact))
            continue
        s = _reduce_chunk(parts, c, algorithm, rs, _noise_of(stochastic_seq, sl.start))
        b = s.b
        if op == "avg":
            v = s.v / float(world)
            b = b / world + v.abs().to(F64) * 2.0**-24
            exact, mags = exact / world, mags / world
        elif op == "premul":
            v = s.v * f32
            fa = abs(float(f32))
            b = b * fa + v.abs().to(F64) * 2.0**-24
            exact, mags = exact * float(f32), mags * fa
        else:
            v = s.v
        o = v.to(dtype)
        out.append(Result(o, b + cast_bound(v.to(F64), dtype) + mags, exact))
    return out


def all_gather(
    xs: Sequence[torch.Tensor],
    ag_bits: int = 8,
    group_size: int = 128,
    symmetric: bool = False,
    rotate: Optional[bool] = None,
) -> Result:
    """The quantized all-gather of the per-rank 1-D shards `xs` (equal numel): what every rank
    holds, rank r's shard at [r*n, (r+1)*n) decoded from the bytes rank r sent (its own rank too);
    rounding to nearest always. Bound: one quantization and the cast, against the inputs. rotate:
    as QuantConfig.rotate (None: on when ag_bits is 4): each shard is padded with zeros to whole
    groups, rotated, quantized, decoded and rotated back (_unrotated_bound for the bound)."""
    if rotate is None:
        rotate = ag_bits == 4
    if rotate:
        return _all_gather_rotated(xs, ag_bits, group_size, symmetric)
    flat = [x.flatten() for x in xs]
    dtype = flat[0].dtype
    ag = Codec(ag_bits or 0, group_size, symmetric, dtype)
    outs, bounds = [], []
    for x in flat:
        y, b = roundtrip(x, ag)
        outs.append(y.to(dtype))
        bounds.append(b + cast_bound(y.to(F64), dtype))
    exact = torch.cat([x.to(F64) for x in flat])
    return Result(torch.cat(outs), torch.cat(bounds), exact)


def _allreduce_rotated(xs, algorithm, rs_bits, ag_bits, g, symmetric, average, seq) -> Result:
    """rotate=True: each rank rotates its input (fp32, padded to whole groups), the allreduce runs
    on the rotated fp32 messages, and every rank rotates the result back (bound:
    _unrotated_bound)."""
    flat = [x.flatten() for x in xs]
    dtype, n, world = flat[0].dtype, flat[0].numel(), len(flat)
    rot = [rotate_forward(x, g) for x in flat]
    r = allreduce(rot, algorithm, rs_bits, ag_bits, g, symmetric, average, False, seq)
    back = rotate_inverse(r.out, g)
    exact = torch.stack([x.to(F64) for x in flat]).sum(0)
    if average:
        exact = exact / world
    bound = _unrotated_bound(
        r.bound, r.out, [_padded(x, g) for x in flat], 1 / world if average else 1, g
    )
    return Result(back[:n].to(dtype), bound[:n] + cast_bound(back[:n].to(F64), dtype), exact)


def _padded(x: torch.Tensor, g: int) -> torch.Tensor:
    """x (1-D) followed by zeros up to whole groups of g."""
    return torch.cat([x, torch.zeros((-x.numel()) % g, dtype=x.dtype)])


def _unrotated_bound(rot_bound, y, xs, scale: float, g: int) -> torch.Tensor:
    """The bound of a result rotated back (rotate_inverse(y)), per element i of group G(i), for
    the rotated-domain value y (fp32) with its bound rot_bound, of the inputs xs (each padded to
    whole groups like y) times `scale` (1, 1/W for AVG, |factor| for PREMUL_SUM): the
    rotated-domain bound, plus the fp32 error of each input's forward transform (at most
    g * 2^-24 * sum_G |x_r|: a butterfly stage doubles the error it receives and adds a rounding
    of at most 2^-24 of a value bounded by sum_G |x_r|, over log2 g stages) times `scale`, mapped
    back by H/g (|H e| / g <= sum_G |e| / g); plus the inverse transform's own rounding
    (2^-24 * sum_G |y|). The final cast is the caller's."""
    fwd_err = torch.zeros(y.numel(), dtype=F64)
    for x in xs:
        fwd_err = fwd_err + g * 2.0**-24 * _group_sum(x.to(F64).abs(), g)
    rot = rot_bound + fwd_err * abs(scale)
    return _group_sum(rot, g) / g + 2.0**-24 * _group_sum(y.to(F64).abs(), g)


def _rows_padded(x: torch.Tensor, rows: int, g: int) -> torch.Tensor:
    """The message x (1-D, `rows` equal rows) with each row padded with zeros to whole groups of
    g: the sharded calls' rotated layout (csrc/algo/run.cpp paddedCopy)."""
    return torch.cat([_padded(r, g) for r in x.flatten().reshape(rows, -1)])


def _reduce_scatter_rotated(xs, algorithm, rs_bits, g, symmetric, op, factor, seq) -> List[Result]:
    """rotate=True: each rank's shard rows are padded to whole groups and rotated (fp32), the
    reduce-scatter runs on those messages (noise indexed in the padded message), and the owner
    scales its fp32 sum, rotates it back and drops the padding before the cast."""
    world = len(xs)
    flat = [x.flatten() for x in xs]
    dtype, n = flat[0].dtype, flat[0].numel() // world
    padded = [_rows_padded(x, world, g) for x in flat]
    rot = [hadamard(x.to(F32), g) for x in padded]
    inner = reduce_scatter(rot, algorithm, rs_bits, g, symmetric, op, factor, seq, rotate=False)
    exact_all = torch.stack([x.to(F64) for x in flat]).sum(0)
    scale = {"avg": 1 / world, "premul": float(torch.tensor(factor or 1.0, dtype=F32))}.get(op, 1)
    out = []
    for c, r in enumerate(inner):
        npad = r.out.numel()
        back = rotate_inverse(r.out, g)[:n]
        ins = [x[c * npad : (c + 1) * npad] for x in padded]
        bound = _unrotated_bound(r.bound, r.out, ins, scale, g)[:n]
        exact = exact_all[c * n : (c + 1) * n] * scale
        out.append(Result(back.to(dtype), bound + cast_bound(back.to(F64), dtype), exact))
    return out


def _all_gather_rotated(xs, ag_bits, g, symmetric) -> Result:
    """rotate=True: each shard padded to whole groups, rotated, quantized once (rounding to
    nearest), decoded and rotated back; the padding dropped."""
    flat = [x.flatten() for x in xs]
    dtype = flat[0].dtype
    ag = Codec(ag_bits, g, symmetric, F32)
    outs, bounds = [], []
    for x in flat:
        p = _padded(x, g)
        y, b = roundtrip(hadamard(p.to(F32), g), ag)
        back = rotate_inverse(y, g)[: x.numel()]
        outs.append(back.to(dtype))
        bound = _unrotated_bound(b, y, [p], 1, g)[: x.numel()]
        bounds.append(bound + cast_bound(back.to(F64), dtype))
    exact = torch.cat([x.to(F64) for x in flat])
    return Result(torch.cat(outs), torch.cat(bounds), exact)


def _chain(parts, ranks, rs: Codec, nz) -> _Tracked:
    """A semi_ring chain: the first rank's input, then at each later rank decode + local; the
    final transfer into the owner is included. nz(rank, phase) gives the encoder's noise."""
    s = _start(parts[ranks[0]])
    for prev, r in zip(ranks[:-1], ranks[1:]):
        s = s.hop(rs, nz(prev, 0))
        s = s.add(parts[r].to(F32), 0.0)
    return s.hop(rs, nz(ranks[-1], 0))
