"""benchmarks/ncu_codec.py's report: it reads Nsight Compute's raw CSV page (what gpu_check.sh asks
ncu for) into one table. The GPU part runs only on a GPU machine; this checks the parsing on a
file written here in ncu's layout: ncu's own lines and the program's output before the header, a
units row under it, thousands separators, display units (usecond, Mbyte) brought back to base,
labels from the kernels' template arguments, and stall reasons ranked."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import ncu_codec  # noqa: E402

HEADER = [
    "ID",
    "Process ID",
    "Process Name",
    "Kernel Name",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "gpu__time_duration.sum",
    "launch__grid_size",
    "launch__registers_per_thread",
    "sm__maximum_warps_per_active_cycle_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
]
UNITS = ["", "", "", "", "Mbyte", "byte", "%", "usecond", "", "register/thread", "%", "%"] + [
    "ratio"
] * 4
KERNELS = [
    # name, read, write, dram %, duration, grid, regs, theoretical, achieved, 4 stalls
    (
        "void qcomm::gpu::(anonymous namespace)::encodeKernel<float, 8, false, 3>"
        "(const T1 *, long)",
        "67.11",
        "17,301,504",
        "61.5",
        "30.25",
        "342",
        "72",
        "37.5",
        "35.2",
        "0.3",
        "21.4",
        "9.9",
        "2.1",
    ),
    (
        "void qcomm::gpu::(anonymous namespace)::decodeKernel<4, true, 4>(const unsigned char *)",
        "9.5",
        "67,108,864",
        "80.1",
        "20.5",
        "2112",
        "43",
        "100",
        "88.0",
        "0",
        "30.0",
        "1.0",
        "4.0",
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, AddFunctor<float>>(int, T2, T3)",
        "67.11",
        "67,108,864",
        "90.0",
        "35",
        "1024",
        "24",
        "100",
        "90",
        "0",
        "10",
        "0",
        "1",
    ),
]


def quoted(cells):
    return ",".join(f'"{c}"' for c in cells)


def write_raw(path):
    lines = [
        "==PROF== Connected to process 4242 (/usr/bin/python3.12)",
        '==PROF== Profiling "encodeKernel" - 0: 0%....50%....100% - 9 passes',
        "ran the codec kernels once each on 64 MiB of fp32",
        quoted(HEADER),
        quoted(UNITS),
    ]
    for i, k in enumerate(KERNELS):
        lines.append(quoted([str(i), "4242", "python3.12", *k]))
    lines.append("==PROF== Disconnected from process 4242")
    path.write_text("\n".join(lines) + "\n")


def test_rows_units_and_labels(tmp_path):
    raw = tmp_path / "raw.csv"
    write_raw(raw)
    rows = ncu_codec.read_raw(raw.read_text())
    assert len(rows) == 3  # the units row and ncu's lines are not kernels
    enc, dec, stream = (ncu_codec.summarize(r) for r in rows)
    assert enc["kernel"] == "encode 8-bit asym, 3 blocks/SM"
    assert dec["kernel"] == "decode 4-bit sym"
    assert stream["kernel"] == "stream (x + 0)"
    staged = "void qcomm::gpu::(anonymous namespace)::encodeKernel<float, 4, true, 3, true>(float)"
    assert ncu_codec.label(staged) == "encode 4-bit sym, 3 blocks/SM, staged"
    assert (
        ncu_codec.label(staged.replace("3, true>", "4, false>")) == "encode 4-bit sym, 4 blocks/SM"
    )
    wide = "void qcomm::gpu::(anonymous namespace)::decodeKernel<(int)8, (bool)0, (int)8>(float)"
    assert ncu_codec.label(wide) == "decode 8-bit asym, 8 items per thread"
    assert enc["us"] == 30.25  # usecond kept as such: 30250 ns / 1e3
    assert dec["us"] == 20.5
    # Mbyte read and byte written, over nanoseconds: GB/s
    assert abs(enc["dram_gbs"] - (67.11e6 + 17301504) / 30250) < 1e-9
    assert enc["dram_pct"] == 61.5
    assert (enc["occupancy"], enc["theoretical"], enc["registers"], enc["grid"]) == (
        35.2,
        37.5,
        72,
        342,
    )
    # ranked, largest first; not_selected is not a stall
    assert enc["stalls"] == [("long_scoreboard", 21.4), ("wait", 2.1), ("barrier", 0.3)]


def test_report_prints_one_row_per_kernel(tmp_path):
    """Given several files, the first with kernels: here ncu's --log-file was not written and its
    CSV went to the step's log."""
    raw = tmp_path / "ncu.log"
    write_raw(raw)
    script = os.path.join(ROOT, "benchmarks", "ncu_codec.py")
    out = subprocess.run(
        [sys.executable, script, "report", str(tmp_path / "ncu_raw.csv"), str(raw)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 4, out  # the header and three kernels
    assert rows[1].startswith(
        "| encode 8-bit asym, 3 blocks/SM | 30.2 | 61.5 | 2790 | 35.2 / 37.5 | 72 | 342 |"
    )
    assert "long_scoreboard 21.4" in rows[1]


def test_report_without_kernels_fails(tmp_path):
    """An ncu that could not read the counters leaves no rows: the report says so and exits 1."""
    raw = tmp_path / "raw.csv"
    raw.write_text("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n")
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "ncu_codec.py"), "report", str(raw)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 1
    assert "no profiled kernels" in r.stdout
