"""The allreduce schedules (two_step, ring, semi_ring) with the CUDA codec operations, whose kernels
(csrc/cuda/codec_kernels.cu) run under the SIMT emulator, their exchanges moved by the CUDA-IPC
transport's copy schedule through host buffers, one thread per rank (scripts/simt_check.sh
schedules, tests/native/simt/schedule_main.cpp): the backend's CUDA-IPC path with the separate
kernels, short of a GPU. Each call is compared bit for bit with qcomm/reference.py and with the
same schedule run with the CPU codec (_testing.ipc_separate_emulate). The other CPU tests
run the schedules with the CPU codec only and the kernels one operation at a time, so the kernels
never met the schedules' call sequences there (a raw ring hop whose partial sum is its local
input gave twice the received values on the GPU, and no CPU test could see it).

The default tier runs a few small calls per world size and algorithm, each axis (fp32/bf16,
raw/8/4 bits, rotation, SUM/AVG) covered; `-m simt_matrix` runs the full product."""

import itertools
import os

import pytest
import torch
from checks import run_script, same_floats

import qcomm
from qcomm import _testing
from qcomm import reference as ref

CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(CUDA_HOME, "include", "cuda_runtime.h")),
    reason=f"no CUDA headers under {CUDA_HOME}",
)

DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

# (rs_bits, ag_bits, dtype, rotate, average): each axis at least once per world size and
# algorithm; the first two are what a raw reduce phase with its partial sums in place runs (an fp32
# message; a rotated one of any dtype), the hop that went wrong on the GPU
DEFAULT_CALLS = [
    (None, 8, torch.float32, False, False),
    (None, 4, torch.bfloat16, True, True),
    (8, 8, torch.bfloat16, False, True),
    (4, 4, torch.float32, True, False),
    (8, None, torch.float32, False, True),
    (4, 8, torch.bfloat16, None, False),  # rotation by the default rule (on: a 4-bit phase)
]
NUMELS = (1000, 1003)  # 1003: a rotated message ends inside a group and runs on a padded copy

MATRIX_BITS = [(None, 8), (None, 4), (8, 8), (8, 4), (4, 8), (4, 4), (8, None), (4, None)]
MATRIX_CALLS = list(
    itertools.product(
        MATRIX_BITS, [torch.float32, torch.bfloat16], [False, True], [False, True], [7, 1000, 4099]
    )
)


def _inputs(world, numel, dtype, seed):
    gens = [torch.Generator().manual_seed(seed * 1000 + r) for r in range(world)]
    return [torch.randn(numel, generator=g).to(dtype) for g in gens]


def _config(algorithm, rs, ag, rotate, stochastic):
    return qcomm.QuantConfig(
        algorithm=algorithm,
        rs_bits=rs,
        ag_bits=ag,
        min_bytes=0,
        rotate=rotate,
        stochastic_rounding=stochastic,
    )


def _run_calls(tmp_path, build_dir, calls):
    """Runs each call (world, algorithm, rs, ag, dtype, rotate, average, numel) with the CUDA codec
    under the emulator and compares every rank's result with the reference and with the CPU codec
    over the same exchange; the problems found."""
    lines, expected = [], []
    for i, (world, algorithm, rs, ag, dtype, rotate, average, numel) in enumerate(calls):
        stochastic = i % 5 == 3
        cfg = _config(algorithm, rs, ag, rotate, stochastic)
        xs = _inputs(world, numel, dtype, 400 + i)
        torch.cat(xs).view(torch.uint8).numpy().tofile(str(tmp_path / f"in{i}.bin"))
        fields = [world, DTYPES[dtype], numel, int(average), i, *cfg.encoded().values()]
        lines.append(" ".join(str(int(f)) for f in fields))
        want = ref.allreduce(
            xs,
            algorithm,
            rs,
            ag,
            average=average,
            rotate=rotate,
            stochastic_seq=i if stochastic else None,
        ).out
        cpu = [x.clone() for x in xs]
        bufs = [torch.zeros(300 << 10, dtype=torch.uint8) for _ in range(world)]
        _testing.ipc_separate_emulate(cpu, bufs, cfg.encoded(), average, i)
        expected.append((want, cpu))
    (tmp_path / "cases.txt").write_text("\n".join(lines) + "\n")
    rc, out = run_script(
        "simt_check.sh", "schedules", str(tmp_path), QCOMM_SIMT_DIR=build_dir, timeout=1800
    )
    assert "simt:" not in out, out[-4000:]  # an emulator error (a divergent warp, a deadlock)
    problems = [] if rc == 0 else [f"the driver exited with {rc}: {out[-3000:]}"]
    for i, (world, algorithm, rs, ag, dtype, rotate, average, numel) in enumerate(calls):
        name = f"call {i}: W={world} {algorithm} {rs}/{ag} {dtype} rotate={rotate} avg={average}"
        path = tmp_path / f"out{i}.bin"
        if not path.exists():
            problems.append(f"{name}: no output")
            continue
        got = torch.frombuffer(bytearray(path.read_bytes()), dtype=dtype).view(world, numel)
        want, cpu = expected[i]
        for r in range(world):
            if not same_floats(got[r], cpu[r]):
                problems.append(f"{name} numel={numel}: rank {r} differs from the CPU codec")
            if not same_floats(got[r], want):
                problems.append(f"{name} numel={numel}: rank {r} differs from the reference")
    return problems, out


@pytest.mark.parametrize("world", [2, 3, 4])
def test_schedules_with_the_cuda_codec_match_the_reference(world, simt_build_dir, tmp_path):
    calls = []
    for algorithm in ("two_step", "ring", "semi_ring"):
        for k, (rs, ag, dtype, rotate, average) in enumerate(DEFAULT_CALLS):
            numel = NUMELS[k % 2] if rotate is not False else NUMELS[0]
            calls.append((world, algorithm, rs, ag, dtype, rotate, average, numel))
    problems, out = _run_calls(tmp_path, simt_build_dir, calls)
    assert not problems, "\n".join(problems[:20])
    assert f"schedules with the CUDA codec: {len(calls)} calls, 0 failed" in out, out[-3000:]


@pytest.mark.simt_matrix
@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("algorithm", ["two_step", "ring", "semi_ring"])
def test_schedules_with_the_cuda_codec_full_matrix(world, algorithm, simt_build_dir, tmp_path):
    calls = [
        (world, algorithm, rs, ag, dtype, rotate, average, numel)
        for (rs, ag), dtype, rotate, average, numel in MATRIX_CALLS
    ]
    problems, out = _run_calls(tmp_path, simt_build_dir, calls)
    assert not problems, "\n".join(problems[:20])


# Reduce-scatters and all-gathers (tests/native/simt/schedule_main.cpp's collectives 1 and 2):
# (collective, algorithm, bits, dtype, op, factor, shard), each axis once per world size: the
# reduce half of each algorithm, SUM, AVG and PREMUL_SUM (the multiply kernel), 4 and 8 bits, each
# dtype; the gather phase alone. Shards of 129 (a group and one) and 64 (under a group).
SHARDED_CALLS = [
    (1, "two_step", 8, torch.bfloat16, "avg", None, 129),
    (1, "ring", 4, torch.float32, "premul", 1 / 3, 129),
    (1, "semi_ring", 4, torch.float32, "sum", None, 64),
    (1, "semi_ring", 8, torch.float16, "premul", 0.5, 129),
    (2, "two_step", 8, torch.bfloat16, "sum", None, 129),
    (2, "two_step", 4, torch.float32, "sum", None, 64),
]
SHARDED_MATRIX = list(
    itertools.product(
        [1],
        ["two_step", "ring", "semi_ring"],
        [8, 4],
        [torch.float32, torch.bfloat16],
        [("sum", None), ("avg", None), ("premul", 0.25)],
        [1, 1000],
    )
) + list(itertools.product([2], ["two_step"], [8, 4], DTYPES, [("sum", None)], [1, 1000]))


def _run_sharded_calls(tmp_path, build_dir, calls):
    """Runs each sharded call (world, collective, algorithm, bits, dtype, op, factor, shard) with
    the CUDA codec under the emulator; compares every rank's output bit for bit with the reference
    and with the CPU codec over the same exchange (ipc_sharded_emulate); the problems found."""
    lines, expected = [], []
    for i, (world, coll, algorithm, bits, dtype, op, factor, shard) in enumerate(calls):
        stochastic = coll == 1 and i % 5 == 3
        cfg = qcomm.QuantConfig(
            algorithm=algorithm,
            rs_bits=bits if coll == 1 else 8,
            ag_bits=bits if coll == 2 else 8,
            min_bytes=0,
            rotate=False,  # CUDA tensors' sharded calls are not rotated
            stochastic_rounding=stochastic,
            reduce_scatter=True,
            all_gather=True,
            tune=False,
        )
        numel = shard * world
        xs = _inputs(world, numel if coll == 1 else shard, dtype, 700 + i)
        torch.cat(xs).view(torch.uint8).numpy().tofile(str(tmp_path / f"in{i}.bin"))
        fields = [world, DTYPES[dtype], numel, int(op == "avg"), i, *cfg.encoded().values(), coll]
        lines.append(" ".join(str(int(f)) for f in fields) + f" {factor or 0!r}")
        bufs = [torch.zeros(300 << 10, dtype=torch.uint8) for _ in range(world)]
        cpu = _testing.ipc_sharded_emulate(xs, bufs, cfg.encoded(), coll, op, factor or 1.0, i)
        if coll == 1:
            res = ref.reduce_scatter(
                xs, algorithm, bits, op=op, factor=factor, stochastic_seq=i if stochastic else None,
                rotate=False,
            )  # fmt: skip
            want = [r.out for r in res]
        else:
            want = [ref.all_gather(xs, bits, rotate=False).out] * world
        expected.append((want, cpu))
    (tmp_path / "cases.txt").write_text("\n".join(lines) + "\n")
    rc, out = run_script(
        "simt_check.sh", "schedules", str(tmp_path), QCOMM_SIMT_DIR=build_dir, timeout=1800
    )
    assert "simt:" not in out, out[-4000:]
    problems = [] if rc == 0 else [f"the driver exited with {rc}: {out[-3000:]}"]
    for i, (world, coll, algorithm, bits, dtype, op, factor, shard) in enumerate(calls):
        name = f"call {i}: W={world} collective {coll} {algorithm} {bits} {dtype} {op}({factor})"
        path = tmp_path / f"out{i}.bin"
        if not path.exists():
            problems.append(f"{name}: no output")
            continue
        per_rank = shard if coll == 1 else shard * world
        got = torch.frombuffer(bytearray(path.read_bytes()), dtype=dtype).view(world, per_rank)
        want, cpu = expected[i]
        for r in range(world):
            if not same_floats(got[r], cpu[r]):
                problems.append(f"{name} shard={shard}: rank {r} differs from the CPU codec")
            if not same_floats(got[r], want[r]):
                problems.append(f"{name} shard={shard}: rank {r} differs from the reference")
    return problems, out


def test_sharded_schedules_with_the_cuda_codec_match_the_reference(simt_build_dir, tmp_path):
    # the default tier: world 3 only (shards of odd ranks' counts, ring partners on both sides);
    # worlds 2 and 4 and the full product are the simt_matrix tier's
    calls = [(3, *c) for c in SHARDED_CALLS]
    problems, out = _run_sharded_calls(tmp_path, simt_build_dir, calls)
    assert not problems, "\n".join(problems[:20])
    assert f"schedules with the CUDA codec: {len(calls)} calls, 0 failed" in out, out[-3000:]


@pytest.mark.simt_matrix
@pytest.mark.parametrize("world", [2, 3, 4])
def test_sharded_schedules_with_the_cuda_codec_full_matrix(world, simt_build_dir, tmp_path):
    calls = [
        (world, coll, algo, bits, dtype, op, factor, shard)
        for coll, algo, bits, dtype, (op, factor), shard in SHARDED_MATRIX
    ]
    problems, out = _run_sharded_calls(tmp_path, simt_build_dir, calls)
    assert not problems, "\n".join(problems[:20])
