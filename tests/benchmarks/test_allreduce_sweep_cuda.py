"""benchmarks/allreduce_sweep.py under torchrun: the launch path and the error computation on CPU
ranks (the rows, their errors equal to the reference algorithm's, every rank's bits identical),
the plan of a CUDA sweep from the GPU count and the world size, the cost model's predictions
beside the rows, and the table's form without a baseline. The same launch with --device cuda runs
only with a GPU (-m cuda)."""

import os
import subprocess
import sys

import pytest
import torch
from checks import gpu

from qcomm import reference as ref

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "allreduce_sweep.py")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import allreduce_sweep as sweep  # noqa: E402
import cost_model as cm  # noqa: E402
import qbench  # noqa: E402


def torchrun(tmp_path, nproc, *args, timeout=120, **env):
    """The sweep on `nproc` torchrun ranks with `args` (and the environment plus `env`); (stdout,
    the CSV's rows)."""
    csv_path = tmp_path / "sweep.csv"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += [f"--nproc_per_node={nproc}", SCRIPT, "--csv", str(csv_path)]
    cmd += ["--plot-dir", str(tmp_path / "plots"), *args]
    environ = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    environ.update(env)
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=environ)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout, sweep.read_csv(str(csv_path))


def check_against_reference(rows, world, seed=1234):
    """Every quantized row's errors are the reference algorithm's (the CPU and the CUDA path give
    its bits), within its bound; every row's output was identical on every rank."""
    for row in rows:
        assert row["identical"], row
        if sweep._is_base(row):
            continue
        dtype = getattr(torch, qbench.DTYPES[row["dtype"]])
        xs = [qbench.make_input(seed, r, row["count"], dtype) for r in range(world)]
        rs, ag = (int(b) for b in row["bits"].split("/"))
        want = ref.allreduce(xs, row["algorithm"].split("@")[0], rs, ag)
        rel, mx = qbench.errors(want.out, want.exact)
        assert f"{row['rel_err']:.3e}" == f"{rel:.3e}", (row, rel)
        assert f"{row['max_abs_err']:.3e}" == f"{mx:.3e}", (row, mx)
        assert 0 < row["max_abs_err"] <= float(want.bound.max()), row
        if (rs, ag) == (8, 8):
            assert row["rel_err"] < 0.02, row  # the 8-bit scale, as tests/integration checks it


def test_torchrun_launch_on_cpu(tmp_path):
    out, rows = torchrun(
        tmp_path,
        2,
        "--device=cpu",
        "--sizes=64K",
        "--bits=8/8,4/8",
        "--algorithms=two_step,ring",
        "--iters=2",
        "--small-iters=2",
    )
    got = [(r["size"], r["algorithm"], r["bits"]) for r in rows]
    configs = [("gloo", "fp32"), ("gloo", "bf16")]
    configs += [(a, b) for a in ("two_step", "ring") for b in ("8/8", "4/8")]
    assert got == [(65536, a, b) for a, b in configs]
    check_against_reference(rows, world=2)
    table = [line.split() for line in out.splitlines() if line.startswith("65536 ")]
    assert [t[3:5] + t[14:15] for t in table] == [  # the table on stdout: the CSV's rows
        [r["algorithm"], r["bits"], f"{r['rel_err']:.3e}"] for r in rows
    ]
    exact, cast = rows[0], rows[1]
    assert exact["rel_err"] < 1e-6 and exact["speedup_exact"] == 1.0
    assert cast["rel_err"] < 1e-2 and cast["allreduce_only_us"] <= cast["time_us"]
    assert all(r["speedup_exact"] > 0 and r["speedup_bf16"] > 0 for r in rows)
    assert "# world=2 dtype=fp32" in out
    for name in ("speedup_vs_size", "rel_err_vs_bits", "time_vs_size"):
        assert (tmp_path / "plots" / f"{name}.png").stat().st_size > 0


def test_cuda_needs_torchrun():
    with pytest.raises(SystemExit) as e:
        sweep.main(["--device", "cuda", "--csv", ""])
    assert e.value.code == 2


@pytest.mark.parametrize(
    "gpus, world, local, peer, transports, nccl",
    [
        (1, 2, 2, True, ["ipc"], False),  # ranks sharing the one GPU: IPC only
        (2, 4, 4, True, ["ipc"], False),  # two ranks a GPU
        (2, 2, 2, True, ["ipc", "nccl"], True),
        (8, 8, 8, True, ["ipc", "nccl"], True),
        (8, 8, 8, False, ["nccl"], True),  # no peer access: no IPC
        (8, 16, 8, True, ["nccl"], True),  # two hosts: no IPC
        (8, 9, 9, True, [], False),  # 9 ranks on 8 GPUs: neither
    ],
)
def test_cuda_plan(gpus, world, local, peer, transports, nccl):
    plan = sweep.cuda_plan(gpus, world, local, ["ipc", "nccl"], peer)
    assert (plan.transports, plan.nccl, plan.shared) == (transports, nccl, not nccl)
    cross = any("cross-GPU part needs 2+ GPUs" in n for n in plan.notes)
    assert cross == (not nccl)
    assert any("no CUDA-IPC" in n for n in plan.notes) == ("ipc" not in transports)
    assert sweep.cuda_plan(gpus, world, local, ["nccl"], peer).transports == [
        t for t in transports if t == "nccl"
    ]


def test_cuda_plan_needs_a_gpu():
    with pytest.raises(ValueError):
        sweep.cuda_plan(0, 2, 2, ["ipc"])


def _opts(*args):
    p = sweep.build_parser()
    a = p.parse_args(["--device=cuda", *args])
    sweep.check_args(p, a)
    return a


def test_predictions_are_the_cost_models():
    opts = _opts("--predict=nvlink=370", "--microshards=2")
    assert opts.dtype == "bf16" and opts.sizes[-1] == 1 << 30 and opts.transports == ["ipc", "nccl"]
    link = cm.parse_links(opts.predict, 3.0)[0]
    costs = cm.KernelCosts.from_csv(opts.kernel_csv)
    n, world = 8 << 20, 4
    for label in ("two_step@ipc", "ring@nccl", "semi_ring@ipc"):
        want = cm.predict(label.split("@")[0], n, world, link, costs, 4, 8, 128, False, 2)
        got = sweep.prediction(label, "4/8", n, opts, world, link, costs)
        assert got == (want.serial_us, want.overlap_us)
    want = cm.nccl_ring(n, 2, world, link, costs)
    assert sweep.prediction("nccl", "bf16", n, opts, world, link, costs) == (
        want.serial_us,
        want.overlap_us,
    )
    assert sweep.prediction("two_step@ipc", "8/none", n, opts, world, link, costs) is None
    fp32 = _opts("--predict=pcie=25", "--dtype=fp32")
    assert sweep.prediction("nccl", "bf16", n, fp32, world, link, costs) is None  # with casts
    assert sweep.prediction("nccl", "fp32", n, fp32, world, link, costs) is not None


def test_bad_cuda_options_are_refused():
    p = sweep.build_parser()
    for args in (
        ["--transports=ipc"],  # on cpu
        ["--device=cuda", "--kernel-csv=x.csv"],  # without --predict
        ["--device=cuda", "--predict=nvlink"],  # no bandwidth
        ["--device=cuda", "--predict=nvlink=370", "--kernel-csv=/nonexistent.csv"],
    ):
        with pytest.raises(SystemExit):
            sweep.check_args(p, p.parse_args(args))
    with pytest.raises(SystemExit):
        p.parse_args(["--device=cuda", "--transports=ipc,shm"])


def _row(algorithm, bits, time_us, **kw):
    row = dict(size=1 << 20, count=1 << 19, dtype="bf16", algorithm=algorithm, bits=bits, iters=5)
    row.update(time_us=time_us, min_us=time_us, max_us=time_us, algbw=1.0, busbw=1.0)
    row.update(wire_bytes=1, speedup_exact=None, speedup_bf16=None, rel_err=1e-3)
    row.update(max_abs_err=1e-2, identical=True)
    row.update(kw)
    return row


def test_table_and_footer_without_a_baseline():
    rows = [_row("two_step@ipc", "8/8", 100.0), _row("ring@ipc", "8/8", 90.0)]
    table = sweep.format_table(rows)
    assert "pred_serial_us" not in table
    assert all(line.split()[12:14] == ["-", "-"] for line in table.splitlines()[2:])
    foot = sweep.footer_lines(rows)
    assert any("cross-GPU comparison needs 2+ GPUs" in line for line in foot), foot
    # with the NCCL baseline and predictions: speed-ups, the predicted columns, no such footer
    rows = [
        _row("nccl", "bf16", 200.0, speedup_exact=1.0, pred_serial_us=150.0, pred_overlap_us=140.0),
        _row("two_step@nccl", "8/8", 100.0, speedup_exact=2.0),
    ]
    table = sweep.format_table(rows).splitlines()
    assert table[0].split()[-2:] == sweep.PRED_COLUMNS
    assert table[2].split()[-2:] == ["150.0", "140.0"] and table[3].split()[-2:] == ["-", "-"]
    assert not sweep.footer_lines(rows)


@gpu
def test_torchrun_launch_on_cuda(tmp_path):
    gpus = torch.cuda.device_count()
    world = gpus if gpus >= 2 else 2  # one GPU: 2 ranks share it, IPC only
    args = ["--device=cuda", "--sizes=1M", "--bits=8/8", "--algorithms=two_step", "--iters=2"]
    out, rows = torchrun(tmp_path, world, *args, timeout=300, QCOMM_IPC_SPIN_TIMEOUT_MS="20000")
    labels = [r["algorithm"] for r in rows]
    if gpus >= 2:
        assert labels == ["nccl", "two_step@ipc", "two_step@nccl"] or labels == [
            "nccl",
            "two_step@nccl",
        ], labels
        assert all(r["speedup_exact"] is not None for r in rows)
    else:
        assert labels == ["two_step@ipc"]
        assert "cross-GPU comparison needs 2+ GPUs" in out
    check_against_reference(rows, world)
