"""The collective path (csrc/algo/ (the schedules)): two_step, ring and semi_ring over the inner
backend's own collectives (one all-to-all and one all-gather, or one send/receive batch per ring
hop). On GPUs it moves CUDA bytes through NCCL; NCCL refuses two ranks on one GPU, so this file's
CPU ranks, where the same orchestration moves CPU bytes through Gloo, are its multi-rank test.

Every result must equal, bit for bit, the existing CPU path's (dist.all_reduce on the same group,
same config, same call sequence number, so stochastic rounding draws the same noise) and the
reference model's, and be identical on every rank."""

import hashlib
import itertools

import pytest
import torch
import torch.distributed as dist
from checks import gpu

import qcomm
from qcomm import _testing
from qcomm import reference as ref

from dist_util import run_ranks

ALGOS = ["two_step", "ring", "semi_ring"]
BITS = [(8, 8), (4, 8), (4, 4), (None, 8), (8, None)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
NUMELS = [1, 7, 1000, 65539]
# (average, stochastic rounding)
MODES = [(False, False), (True, True), (False, True), (True, False)]


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, NaN payloads included."""
    return a.dtype == b.dtype and torch.equal(_bytes(a), _bytes(b))


def _inputs(world, numel, dtype, seed):
    xs = []
    for r in range(world):
        g = torch.Generator().manual_seed(seed * 1000 + r)
        xs.append((torch.randn(numel, generator=g) * (1.0 + r)).to(dtype))
    return xs


def _cases(world):
    """Every algorithm x bits x dtype x numel. The four (SUM/AVG, stochastic off/on) modes rotate
    over the numels of each (algorithm, bits, dtype), so each such triple meets every mode; the
    largest message runs in one dtype per (algorithm, bits), rotating, for time."""
    cases = []
    for (a, algo), (b, (rs, ag)), (d, dtype), (n, numel) in itertools.product(
        enumerate(ALGOS), enumerate(BITS), enumerate(DTYPES), enumerate(NUMELS)
    ):
        if numel == NUMELS[-1] and d != (a + b + world) % len(DTYPES):
            continue
        avg, sr = MODES[(n + d + a + b + world) % len(MODES)]
        cases.append((algo, rs, ag, dtype, numel, avg, sr))
    return cases


def _one(rank, world, i, case):
    """Run one case through the hook and through dist.all_reduce; return (problems, digest)."""
    algo, rs, ag, dtype, numel, avg, sr = case
    name = f"{algo} rs={rs} ag={ag} {dtype} n={numel} avg={avg} sr={sr} W={world}"
    cfg = qcomm.QuantConfig(
        algorithm=algo, rs_bits=rs, ag_bits=ag, min_bytes=0, microshards=3, stochastic_rounding=sr
    )
    qcomm.set_config(cfg)
    xs = _inputs(world, numel, dtype, i)
    seq = qcomm.stats()["next_call_seq"]
    y = _testing.collective_allreduce_for_test(qcomm.backend_of(), xs[rank].clone(), avg)
    problems = []
    if qcomm.stats()["next_call_seq"] != seq:
        problems.append(f"{name}: the hook advanced the call sequence number")
    x = xs[rank].clone()
    dist.all_reduce(x, op=dist.ReduceOp.AVG if avg else dist.ReduceOp.SUM)
    if qcomm.stats()["next_call_seq"] != seq + 1:
        problems.append(f"{name}: dist.all_reduce was not quantized")
    if not _same(y, x):
        problems.append(f"{name}: differs from the CPU path (dist.all_reduce)")
    if i % world == rank:  # every rank holds the same bits (checked below): one checks the model
        r = ref.allreduce(xs, algo, rs, ag, average=avg, stochastic_seq=seq if sr else None)
        if not _same(y, r.out):
            problems.append(f"{name}: differs from qcomm/reference.py")
    return problems, hashlib.sha1(_bytes(y).numpy().tobytes()).hexdigest()


def _matrix_worker(rank, world, cases):
    problems, digests = [], []
    for i, case in enumerate(cases):
        p, d = _one(rank, world, i, case)
        problems += p
        digests.append(d)
    everyone = [None] * world
    dist.all_gather_object(everyone, digests)
    for i, case in enumerate(cases):
        if len({ds[i] for ds in everyone}) != 1:
            problems.append(f"{case} W={world}: ranks disagree")
    return problems


@pytest.mark.parametrize("world", [2, 3, 4])
def test_matches_cpu_path_and_reference(world):
    print("qcomm from", qcomm.__file__)
    problems = run_ranks(_matrix_worker, world, _cases(world), timeout=300)
    flat = sorted(set(p for ps in problems for p in ps))
    assert not flat, f"{len(flat)} problems:\n" + "\n".join(flat[:30])


def _world1_worker(rank, world):
    """force_world1 (the only case one GPU can run over NCCL) on CPU: two_step is both phases'
    round trips, the rings only the gather phase's (there is no hop), as the reference says."""
    problems = []
    be = qcomm.backend_of()
    for i, (algo, (rs, ag), dtype) in enumerate(itertools.product(ALGOS, BITS, DTYPES)):
        (x,) = _inputs(1, 1000, dtype, i)
        for avg, sr in MODES:
            seq = 10 * i + 3
            qcomm.set_config(
                qcomm.QuantConfig(
                    algorithm=algo, rs_bits=rs, ag_bits=ag, min_bytes=0, stochastic_rounding=sr
                )
            )
            y = _testing.collective_allreduce_for_test(
                be, x.clone(), avg, force_world1=True, call_seq=seq
            )
            model_algo = "ring" if algo == "semi_ring" else algo  # semi_ring: no chain at W=1
            r = ref.allreduce(
                [x], model_algo, rs, ag, average=avg, stochastic_seq=seq if sr else None
            )
            if not _same(y, r.out):
                problems.append(f"W=1 {algo} {rs}/{ag} {dtype} avg={avg} sr={sr}: != reference")
    # without force_world1 a group of one passes through: the hook says so
    try:
        _testing.collective_allreduce_for_test(be, torch.ones(8), False)
        problems.append("a world-1 plan without force_world1 ran")
    except ValueError as e:
        if "world size 1" not in str(e):
            problems.append(f"unexpected message: {e}")
    return problems


def test_world1_forced_plan():
    problems = run_ranks(_world1_worker, 1)
    flat = [p for ps in problems for p in ps]
    assert not flat, "\n".join(flat[:30])


ROTATED_BITS = [(8, 8), (4, 4), (4, 8), (None, 8), (8, None)]


def _rotated_worker(rank, world):
    """rotate=True on this path (the schedules rotate through CodecOps): every algorithm, fp32 and
    bf16, numels that end inside a group (the hook pads a copy with zeros to whole groups) and
    one that does not, bit for bit against dist.all_reduce (the CPU path) and the reference."""
    problems = []
    be = qcomm.backend_of()
    cases = itertools.product(ALGOS, [torch.float32, torch.bfloat16], [1000, 7, 4096])
    for i, (algo, dtype, numel) in enumerate(cases):
        rs, ag = ROTATED_BITS[i % len(ROTATED_BITS)]
        avg, sr = MODES[i % len(MODES)]
        name = f"rotated {algo} rs={rs} ag={ag} {dtype} n={numel} avg={avg} sr={sr} W={world}"
        qcomm.set_config(
            qcomm.QuantConfig(
                algorithm=algo,
                rs_bits=rs,
                ag_bits=ag,
                min_bytes=0,
                microshards=3,
                rotate=True,
                stochastic_rounding=sr,
            )
        )
        xs = _inputs(world, numel, dtype, 500 + i)
        seq = qcomm.stats()["next_call_seq"]
        y = _testing.collective_allreduce_for_test(be, xs[rank].clone(), avg)
        x = xs[rank].clone()
        dist.all_reduce(x, op=dist.ReduceOp.AVG if avg else dist.ReduceOp.SUM)
        if not _same(y, x):
            problems.append(f"{name}: differs from the CPU path (dist.all_reduce)")
        r = ref.allreduce(
            xs, algo, rs, ag, average=avg, rotate=True, stochastic_seq=seq if sr else None
        )
        if not _same(y, r.out):
            problems.append(f"{name}: differs from qcomm/reference.py")
    qcomm.set_config(qcomm.QuantConfig(min_bytes=0))
    return problems


@pytest.mark.parametrize("world", [2, 3])
def test_rotated_matches_cpu_path_and_reference(world):
    problems = run_ranks(_rotated_worker, world, timeout=300)
    flat = [p for ps in problems for p in ps]
    assert not flat, f"{len(flat)} problems:\n" + "\n".join(flat[:30])


HOP_BITS = [(8, 8), (4, 4), (4, 8), (8, 4), (0, 8), (8, 0), (0, 0)]


def _hop_case(i, in_bits, out_bits, dtype, sym, stochastic, n=1000):
    """Inputs of one ring hop: the received bytes, the local chunk, the codecs and the noise."""
    g = torch.Generator().manual_seed(i)
    received = torch.randn(n, generator=g) * 3.0
    local = torch.randn(n, generator=g).to(dtype)
    cin = ref.Codec(in_bits, 64, sym, dtype)
    cout = ref.Codec(out_bits, 64, sym, dtype)
    noise = (ref.noise_salt(i, 1, 0), 4096) if stochastic else None
    return ref.encode_bytes(received, cin), local, cin, cout, noise


def _hop(src, local, cin, cout, noise):
    salt, base = noise if noise is not None else (None, 0)
    return qcomm.codec.ring_hop(
        src,
        local,
        cin.bits,
        cout.bits,
        cin.group_size,
        cin.symmetric,
        noise_salt=salt,
        noise_base=base,
    )


def _hop_cases():
    return itertools.product(HOP_BITS, DTYPES, (False, True), (False, True))


def test_cpu_codec_ops_hop_matches_reference():
    """CpuCodecOps.decodeAddEncode, the ring hop: partial = decoded + local, then encoded."""
    for i, ((ib, ob), dtype, sym, sr) in enumerate(_hop_cases()):
        src, local, cin, cout, noise = _hop_case(i, ib, ob, dtype, sym, sr)
        partial, dst = _hop(src, local, cin, cout, noise)
        n = local.numel()
        if ib:
            # the CPU codec's decode, checked against the model in test_codec.py
            decoded = qcomm.codec.decode(src, n, ib, cin.group_size, sym, dtype)
        else:
            decoded = src.view(dtype).float()
        want = decoded + local.float()
        assert _same(partial, want), (ib, ob, dtype, sym, sr)
        assert torch.equal(dst, ref.encode_bytes(want, cout, noise)), (ib, ob, dtype, sym, sr)


@gpu
def test_cuda_codec_ops_hop_equals_cpu():
    """CudaCodecOps.decodeAddEncode (the fused hop kernel; world 1 has no hop to run it) gives the
    CPU's partial sums and wire bytes."""
    for i, ((ib, ob), dtype, sym, sr) in enumerate(_hop_cases()):
        src, local, cin, cout, noise = _hop_case(i, ib, ob, dtype, sym, sr, n=70001)
        partial, dst = _hop(src, local, cin, cout, noise)
        cpartial, cdst = _hop(src.cuda(), local.cuda(), cin, cout, noise)
        assert _same(cpartial.cpu(), partial), (ib, ob, dtype, sym, sr)
        assert torch.equal(cdst.cpu(), dst), (ib, ob, dtype, sym, sr)


def _cuda_worker(rank, world):
    """One GPU, world 1 (NCCL's only single-GPU case): the CUDA path, on the current stream (a
    side stream too), gives the CPU path's bits for every algorithm, bit width and dtype."""
    torch.cuda.set_device(0)
    problems = []
    be = qcomm.backend_of()
    side = torch.cuda.Stream()
    for i, (algo, (rs, ag), dtype, numel) in enumerate(
        itertools.product(ALGOS, BITS, DTYPES, [1, 7, 1000, 65539, 1 << 20])
    ):
        (x,) = _inputs(1, numel, dtype, i)
        for avg, sr in MODES:
            qcomm.set_config(
                qcomm.QuantConfig(
                    algorithm=algo, rs_bits=rs, ag_bits=ag, min_bytes=0, stochastic_rounding=sr
                )
            )
            want = _testing.collective_allreduce_for_test(be, x.clone(), avg, force_world1=True)
            stream = side if i % 2 else torch.cuda.current_stream()
            with torch.cuda.stream(stream):
                xc = x.cuda()
                got = _testing.collective_allreduce_for_test(be, xc, avg, force_world1=True)
            stream.synchronize()
            if got.data_ptr() != xc.data_ptr() or not _same(got.cpu(), want):
                problems.append(f"CUDA {algo} {rs}/{ag} {dtype} n={numel} avg={avg} sr={sr}")
    return problems


@gpu
def test_cuda_world1_equals_cpu():
    problems = run_ranks(_cuda_worker, 1, timeout=600)
    flat = [p for ps in problems for p in ps]
    assert not flat, f"{len(flat)} problems:\n" + "\n".join(flat[:30])
