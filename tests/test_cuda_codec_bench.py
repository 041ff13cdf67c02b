"""benchmarks/cuda_codec_bench.py's own logic, on the CPU: the GPU call that runs it is scarce, so
its tables are checked here with the kernels and the timer replaced by fakes. The fake timer
reads the launch settings as the kernels do (at every launch): each variant must be timed with
exactly its settings, the default with none, and the caller's environment must be restored."""

import csv
import os
import sys
import types

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import cuda_codec_bench as bench  # noqa: E402


def fake_time(fn, iters=20):
    """10 us, x0.9 with the prefetch, x0.8 with 4 encode blocks, x0.7 staged (only where the
    variant applies: the fake encoder notes that it ran)."""
    fn()
    t = 10e-6
    if os.environ.get("QCOMM_CUDA_PREFETCH") == "1":
        t *= 0.9
    if os.environ.get("QCOMM_CUDA_ENCODE_BLOCKS") == "4":
        assert fake_time.kernel == "encode", "4 encode blocks timed on a decoder"
        t *= 0.8
    if os.environ.get("QCOMM_CUDA_ENCODE_STAGED") == "1":
        assert fake_time.kernel == "encode", "the staged encoder timed on a decoder"
        t *= 0.7
    return t


def test_variants_table(tmp_path, monkeypatch):
    def encode(x, bits, group, sym):
        fake_time.kernel = "encode"
        return torch.zeros(x.numel() * bits // 8 + 64, dtype=torch.uint8)

    def decode(e, n, bits, group, sym):
        fake_time.kernel = "decode"
        return torch.zeros(n)

    fake_cuda = types.SimpleNamespace(is_available=lambda: True, get_device_name=lambda: "fake")
    monkeypatch.setattr(
        bench,
        "torch",
        types.SimpleNamespace(
            cuda=fake_cuda,
            __version__="fake",
            randn=lambda n, device=None: torch.randn(n),
            empty_like=torch.empty_like,
        ),
    )
    monkeypatch.setattr(bench, "qcomm", types.SimpleNamespace(compiled_with_cuda=lambda: True))
    monkeypatch.setattr(
        bench, "_C", types.SimpleNamespace(cuda_codec_encode=encode, cuda_codec_decode=decode)
    )
    monkeypatch.setattr(bench, "timed", fake_time)
    monkeypatch.setenv("QCOMM_CUDA_PREFETCH", "0")  # the caller's own setting
    monkeypatch.delenv("QCOMM_CUDA_ENCODE_BLOCKS", raising=False)
    monkeypatch.setenv("QCOMM_CUDA_ENCODE_STAGED", "1")  # never leaks into another variant
    main_csv, var_csv = tmp_path / "k.csv", tmp_path / "v.csv"
    argv = ["bench", "--sizes-mib", "1", "--csv", str(main_csv), "--variants-csv", str(var_csv)]
    monkeypatch.setattr(sys, "argv", argv)
    assert bench.main() == 0
    assert os.environ["QCOMM_CUDA_PREFETCH"] == "0"
    assert "QCOMM_CUDA_ENCODE_BLOCKS" not in os.environ
    assert os.environ["QCOMM_CUDA_ENCODE_STAGED"] == "1"

    main_rows = list(csv.DictReader(open(main_csv)))
    assert [r["kernel"] for r in main_rows] == ["copy"] + ["encode", "decode"] * 4
    assert all(r["time_us"] == "10.0" for r in main_rows)  # the default: no setting at all

    rows = list(csv.DictReader(open(var_csv)))
    assert len(rows) == 8
    for r in rows:
        assert r["speed-up prefetch"] == "1.11"
        if r["kernel"] == "encode":
            assert (r["speed-up 4 blocks"], r["speed-up both"]) == ("1.25", "1.39")
            assert r["speed-up staged"] == "1.43"
            assert r["best x copy"].endswith("(staged)")
        else:
            assert (r["time_us 4 blocks"], r["time_us both"], r["time_us staged"]) == ("-",) * 3
            assert r["best x copy"].endswith("(prefetch)")
