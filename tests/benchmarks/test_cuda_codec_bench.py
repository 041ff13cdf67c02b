"""benchmarks/cuda_codec_bench.py's own logic, on the CPU: the GPU call that runs it is scarce, so
its tables are checked here with the kernels and the timer replaced by fakes. The fake timer
reads the launch settings as the kernels do, from the extension's process settings, which read
the environment only at qcomm.reload_settings() (FakeSettings): each variant must be timed
with exactly its settings, reloaded, the default with none, and the caller's environment and
settings must be restored. Its first timing of anything (a decoder's second) is 1.5x slow, so only
the faster of two turns reads the true time: the copy must be timed as the kernels are."""

import csv
import os
import sys
import types

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import cuda_codec_bench as bench  # noqa: E402

N = 2**20 // 4  # the elements of 1 MiB of fp32


LAUNCH_SETTINGS = ("QCOMM_CUDA_FULL_GRID", "QCOMM_CUDA_ENCODE_BLOCKS")


class FakeSettings:
    """The extension's process settings: the environment as it was at the last reload (as
    csrc/common/settings.h keeps them), and the number of reloads."""

    def __init__(self):
        self.reloads = 0
        self.values = {k: os.environ.get(k) for k in LAUNCH_SETTINGS}

    def reload_settings(self):
        self.reloads += 1
        self.values = {k: os.environ.get(k) for k in LAUNCH_SETTINGS}

    def get(self, k):
        return self.values[k]


class FakeTimer:
    """10 us, x0.8 with 4 encode blocks (only where the variant applies: the fake encoder notes
    that it ran), x0.95 with the full grid, x1.1 on the resident grid (QCOMM_CUDA_FULL_GRID=0),
    as the settings read at the last reload say; x1.5 the first time a function is timed with
    given settings (a decoder: the second time). `hook(timer)` runs before every timing (it may
    raise, as a refused launch would)."""

    def __init__(self, hook=None):
        self.kernel, self.numel, self.hook, self.count = None, None, hook, {}
        self.settings = None  # FakeSettings, from run_bench

    def __call__(self, fn, iters=20):
        fn()
        if self.hook:
            self.hook(self)
        t = 10e-6
        get = self.settings.get
        if get("QCOMM_CUDA_ENCODE_BLOCKS") == "4":
            assert self.kernel == "encode", "4 encode blocks timed on a decoder"
            t *= 0.8
        if get("QCOMM_CUDA_FULL_GRID") == "1":
            t *= 0.95
        if get("QCOMM_CUDA_FULL_GRID") == "0":
            t *= 1.1
        key = (fn, tuple(get(k) for k in bench.SETTINGS))
        self.count[key] = self.count.get(key, 0) + 1
        if self.count[key] == (2 if self.kernel == "decode" else 1):
            t *= 1.5
        return t

    def variant(self):
        return any(self.settings.get(k) == v for _, e, _ in bench.VARIANTS for k, v in e.items())


def run_bench(monkeypatch, tmp_path, timer, sizes="1"):
    """main() with the fakes; returns its exit status and the two CSV paths."""

    def encode(x, bits, group, sym):
        timer.kernel, timer.numel = "encode", x.numel()
        return torch.zeros(x.numel() * bits // 8 + 64, dtype=torch.uint8)

    def decode(e, n, bits, group, sym):
        timer.kernel, timer.numel = "decode", n
        return torch.zeros(n)

    def copy(x, y):
        timer.kernel, timer.numel = "copy", x.numel()
        return y.copy_(x)

    fake_cuda = types.SimpleNamespace(is_available=lambda: True, get_device_name=lambda: "fake")
    fake_torch = types.SimpleNamespace(
        cuda=fake_cuda,
        __version__="fake",
        randn=lambda n, device=None: torch.randn(n),
        empty_like=lambda x: types.SimpleNamespace(
            copy_=lambda src: copy(src, torch.empty_like(x))
        ),
    )
    monkeypatch.setattr(bench, "torch", fake_torch)
    timer.settings = FakeSettings()
    fake_qcomm = types.SimpleNamespace(
        compiled_with_cuda=lambda: True,
        reload_settings=timer.settings.reload_settings,
        codec=types.SimpleNamespace(encode=encode, decode=decode),
    )
    monkeypatch.setattr(bench, "qcomm", fake_qcomm)
    monkeypatch.setattr(bench, "timed", timer)
    main_csv, var_csv = tmp_path / "k.csv", tmp_path / "v.csv"
    argv = ["bench", "--sizes-mib", sizes, "--csv", str(main_csv), "--variants-csv", str(var_csv)]
    monkeypatch.setattr(sys, "argv", argv)
    return bench.main(), main_csv, var_csv


def rows(path):
    return list(csv.DictReader(open(path)))


def x_copy(bits, mib=1):
    """a kernel's 'x copy' when it and the copy take the same time: its bytes over the copy's"""
    n = mib * N
    return f"{(n * 4 + n * bits // 8 + 64) / (2 * n * 4):.2f}"


def test_default_table_first_then_the_variants(tmp_path, monkeypatch, capsys):
    before_variants = {}

    def hook(timer):  # at the first variant timing: what has been written and printed by then
        if timer.variant() and not before_variants:
            before_variants["csv"] = rows(tmp_path / "k.csv")
            before_variants["stdout"] = capsys.readouterr().out
            print(before_variants["stdout"], end="")

    # the caller's own setting: it never leaks into the default or another variant (the
    # settings as first read hold it, so a timing without a reload would read it too)
    monkeypatch.setenv("QCOMM_CUDA_ENCODE_BLOCKS", "4")
    monkeypatch.delenv("QCOMM_CUDA_FULL_GRID", raising=False)
    timer = FakeTimer(hook)
    status, main_csv, var_csv = run_bench(monkeypatch, tmp_path, timer)
    assert status == 0
    assert os.environ["QCOMM_CUDA_ENCODE_BLOCKS"] == "4"
    assert "QCOMM_CUDA_FULL_GRID" not in os.environ
    # and the extension's settings read back from the caller's environment at the end
    assert timer.settings.values == {"QCOMM_CUDA_ENCODE_BLOCKS": "4", "QCOMM_CUDA_FULL_GRID": None}
    assert timer.settings.reloads > 0

    main_rows = rows(main_csv)
    assert [r["kernel"] for r in main_rows] == ["copy"] + ["encode", "decode"] * 4
    # the default (no setting at all) and the copy alike: the faster of two turns
    assert all(r["time_us"] == "10.0" for r in main_rows)
    for r in main_rows[1:]:
        assert r["x copy"] == x_copy(int(r["bits"])), r
    # the default table was complete, written and printed, before any variant was timed
    assert before_variants["csv"] == main_rows
    assert "| 1 | decode | 4 | sym | 10.0 |" in before_variants["stdout"]
    assert "(4 blocks" not in before_variants["stdout"]  # no variant row yet

    var_rows = rows(var_csv)
    assert len(var_rows) == 8
    for r in var_rows:
        assert r["time_us"] == "10.0"
        assert r["speed-up full grid"] == "1.05"
        assert (r["time_us resident, 3 blocks"], r["speed-up resident, 3 blocks"]) == (
            "11.0",
            "0.91",
        )
        if r["kernel"] == "encode":
            assert r["speed-up 4 blocks"] == "1.25"
            assert r["speed-up 4 blocks, full grid"] == "1.32"
            assert r["best x copy"].endswith("(4 blocks, full grid)")
        else:
            assert (r["time_us 4 blocks"], r["time_us 4 blocks, full grid"]) == ("-", "-")
            assert r["best x copy"].endswith("(full grid)")


def test_a_variant_that_raises_reads_error_and_the_rest_go_on(tmp_path, monkeypatch, capsys):
    written_by_then = []

    def hook(timer):
        get = timer.settings.get
        both = get("QCOMM_CUDA_ENCODE_BLOCKS") == "4" and get("QCOMM_CUDA_FULL_GRID") == "1"
        if both and timer.numel == 2 * N and not written_by_then:
            written_by_then.append(len(rows(tmp_path / "v.csv")))
        if both and timer.numel == N:  # refused at 1 MiB, not at 2
            raise RuntimeError("too many resources requested for launch")

    for k in LAUNCH_SETTINGS:
        monkeypatch.delenv(k, raising=False)
    status, main_csv, var_csv = run_bench(monkeypatch, tmp_path, FakeTimer(hook), sizes="1,2")
    assert status == 1  # the failure is reported in the exit status
    err = capsys.readouterr().err
    assert "1 MiB encode 8 asym 4 blocks, full grid: RuntimeError: too many resources" in err
    assert len(rows(main_csv)) == 18
    var_rows = rows(var_csv)
    assert len(var_rows) == 16
    assert written_by_then == [8]  # each row flushed as it is done
    for r in var_rows:
        assert r["time_us"] == "10.0" and r["speed-up full grid"] == "1.05", r
        if r["kernel"] != "encode":
            continue
        assert r["speed-up 4 blocks"] == "1.25", r
        cells = (r["time_us 4 blocks, full grid"], r["speed-up 4 blocks, full grid"])
        if r["MiB"] == "1":
            assert cells == ("error", "error"), r
            assert r["best x copy"].endswith("(4 blocks)"), r
        else:
            assert cells == ("7.6", "1.32"), r
            assert r["best x copy"].endswith("(4 blocks, full grid)"), r


def test_timed_starts_its_region_behind_a_sleep(monkeypatch):
    # the launches of the timed region queue behind torch.cuda._sleep, so the host's launch
    # overhead falls outside the events
    log, events = [], []

    class Event:
        def __init__(self, enable_timing=False):
            self.i = len(events)
            events.append(self)

        def record(self):
            log.append(f"record {self.i}")

        def elapsed_time(self, end):
            return 6.0  # ms

    cuda = types.SimpleNamespace(
        Event=Event, synchronize=lambda: log.append("sync"), _sleep=lambda c: log.append("sleep")
    )
    monkeypatch.setattr(bench, "torch", types.SimpleNamespace(cuda=cuda))
    t = bench.timed(lambda: log.append("fn"), iters=3)
    assert log == ["fn", "sync", "sleep", "record 0", "fn", "fn", "fn", "record 1", "sync"]
    assert t == pytest.approx(2e-3)
