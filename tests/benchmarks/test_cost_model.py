"""benchmarks/cost_model.py: its wire bytes against the extension's own count, its limits (free
codec, free link), monotonicity, and its command line. CPU only, a few seconds."""

import csv
import math
import os
import subprocess
import sys

import inproc
import pytest
import torch

import qcomm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import cost_model as cm  # noqa: E402

MIB = 1 << 20


@pytest.fixture(scope="module")
def costs():
    return cm.KernelCosts.from_csv(cm.DEFAULT_CSV)


def synthetic(tmp_path, extra=()):
    """A CSV with round numbers: per-byte time 1 us/MiB for every codec kernel at 64 MiB and
    0.5 us/MiB at 1024 MiB; copy 0.1 us/MiB."""
    path = tmp_path / "k.csv"
    rows = [["MiB", "kernel", "bits", "scale", "time_us", "GB/s (read+write)", "x copy"]]
    for mib, per in ((64, 1.0), (1024, 0.5)):
        rows.append([mib, "copy", "-", "-", 0.1 * mib, 0, 1])
        for kind in ("encode", "decode"):
            for bits in (8, 4):
                for scale in ("asym", "sym"):
                    rows.append([mib, kind, bits, scale, per * mib, 0, 0])
    rows += list(extra)
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return str(path)


def test_encoded_bytes_is_the_extensions():
    assert cm.ENCODED_BYTES_SOURCE == "qcomm.codec.encoded_bytes"
    for n in (1, 5, 127, 128, 129, 1000, 4096, 100003):
        for bits in (4, 8):
            for g in (32, 128, 1024):
                for sym in (False, True):
                    want = qcomm.codec.encoded_bytes(n, bits, g, sym)
                    assert cm.encoded_bytes(n, bits, g, sym) == want
                    assert cm._encoded_bytes_py(n, bits, g, sym) == want


def test_wire_bytes_match_what_qnccl_ranks_send():
    """The model's per-rank bytes equal what in-process qnccl ranks count as sent, minus the
    plan-header exchange every call makes (one small fixed header to each peer)."""
    world = 3
    g = inproc.InProcGroup(world)
    diffs = set()
    for algo in cm.ALGORITHMS:
        for rb, ab, ms, n in ((8, 8, 1, 3 * 128 * 10), (4, 8, 4, 100003), (4, 4, 2, 1000)):
            for sym in (False, True):
                cfg = qcomm.QuantConfig(
                    min_bytes=0,
                    algorithm=algo,
                    rs_bits=rb,
                    ag_bits=ab,
                    microshards=ms,
                    symmetric=sym,
                )
                g.set_config(cfg)
                before = [g.stats(r)["wire_bytes"] for r in range(world)]
                g.allreduce([torch.randn(n, dtype=torch.bfloat16) for _ in range(world)])
                sent = [g.stats(r)["wire_bytes"] - before[r] for r in range(world)]
                # a rotated plan (the default at 4 bits) runs on the message padded to whole groups
                padded = -(-n // 128) * 128 if cfg.rotates else n
                model = cm.wire_bytes_per_rank(padded, world, rb, ab, 128, sym, ms)
                diffs |= {s - (a + b) for s, (a, b) in zip(sent, model)}
    assert len(diffs) == 1, diffs
    (d,) = diffs
    assert d % (world - 1) == 0 and 0 <= d // (world - 1) <= 128, d


def test_wire_bytes_clean_case():
    n, W, M = 8 * 4 * 128 * 100, 8, 4
    per_shard = n // W // M
    got = cm.wire_bytes_per_rank(n, W, 8, 4, 128, False, M)
    rs = (W - 1) * M * qcomm.codec.encoded_bytes(per_shard, 8, 128, False)
    ag = (W - 1) * M * qcomm.codec.encoded_bytes(per_shard, 4, 128, False)
    assert got == [(rs, ag)] * W


@pytest.mark.parametrize("rb,ab", [(8, 8), (4, 8), (4, 4)])
@pytest.mark.parametrize("W", [2, 4, 8])
def test_free_codec_speedup_is_the_byte_ratio(costs, rb, ab, W):
    free = cm.KernelCosts.from_csv(cm.DEFAULT_CSV, codec_scale=0.0)
    link = cm.Link("x", 100.0, alpha_us=0.0)
    n = 64 * MIB // 4
    nccl = cm.nccl_ring(n, 4, W, link, None)
    # bytes per element on the wire: bits/8 + 8 bytes of scale and mid per 128 elements
    ratio = 4.0 / ((rb + ab) / 16 + 8 / 128)
    for algo in cm.ALGORITHMS:
        p = cm.predict(algo, n, W, link, free, rb, ab)
        for t in (p.serial_us, p.overlap_us):
            assert nccl.overlap_us / t == pytest.approx(ratio, rel=0.01)
    # and with the measured codec it is strictly less
    p = cm.predict("two_step", n, W, link, costs, rb, ab)
    assert nccl.overlap_us / p.overlap_us < ratio * 0.99


def test_infinite_link_codec_binds(costs):
    # a free link: nothing is on the wire, the codec binds. With no latency per step either, what
    # is left is HBM work, and qnccl's codec does more of it than NCCL's ring reduction, so it is
    # slower. (With latency, two_step's 2 steps against the ring's 2(W-1) can make up for it at
    # small sizes: with the kernels of 2026-11-30, 16 MiB at alpha 3 us, 63.2 against 64.4 us.)
    for alpha in (3.0, 0.0):
        inf = cm.Link("inf", math.inf, alpha_us=alpha)
        for mib in (16, 64, 256, 1024):
            n = mib * MIB // 2
            bf = cm.nccl_ring(n, 2, 8, inf, costs).overlap_us
            for algo in cm.ALGORITHMS:
                for rb, ab in ((8, 8), (4, 4)):
                    p = cm.predict(algo, n, 8, inf, costs, rb, ab)
                    assert p.link_us == 0 and p.bound == "codec"
                    if alpha == 0.0:
                        assert p.overlap_us > bf, (mib, algo, rb)


def test_monotonic_in_bandwidth_and_codec_speed(costs):
    n = 64 * MIB // 2
    for algo in cm.ALGORITHMS:
        prev = None
        for gbps in (10, 25, 50, 100, 370, 1000, 10000):
            p = cm.predict(algo, n, 8, cm.Link("l", gbps), costs)
            assert p.overlap_us <= p.serial_us
            if prev is not None:
                assert p.serial_us < prev.serial_us and p.overlap_us <= prev.overlap_us
            prev = p
        slow = cm.KernelCosts.from_csv(cm.DEFAULT_CSV, codec_scale=2.0)
        fast = cm.KernelCosts.from_csv(cm.DEFAULT_CSV, codec_scale=0.5)
        link = cm.Link("nvlink", 370)
        times = [cm.predict(algo, n, 8, link, c).overlap_us for c in (fast, costs, slow)]
        assert times == sorted(times) and times[0] < times[2]
    prev = None
    for gbps in (10, 25, 370, 1000):
        t = cm.nccl_ring(n, 2, 8, cm.Link("l", gbps), costs).overlap_us
        assert prev is None or t < prev
        prev = t


def test_hand_computed_two_step_and_nccl(tmp_path):
    kc = cm.KernelCosts.from_csv(synthetic(tmp_path), launch_us=4.0)
    # exactly on a row: the row's time; between rows: between the rows' per-byte times
    assert kc.kernel_us("encode", 8, False, 64 * MIB // 4) == pytest.approx(64.0)
    mid = kc.kernel_us("encode", 8, False, 256 * MIB // 4)
    assert 0.5 * 256 < mid < 1.0 * 256
    assert mid == pytest.approx(256 * 0.75)  # 256 is halfway between 64 and 1024 in log size
    # below the smallest row: linear at that row's per-byte time, plus the launch overhead
    assert kc.kernel_us("decode", 4, True, MIB // 4) == pytest.approx(1.0 + 4.0)
    assert kc.hbm_gbps(64 * MIB) == pytest.approx(2 * MIB / 0.1e-6 / 1e9)

    W, n, link = 8, 1024 * MIB // 4, cm.Link("l", 100.0, alpha_us=2.0)
    ce = n // W
    (rs, ag), *_ = cm.wire_bytes_per_rank(n, W, 8, 8)
    e_full = 0.5 * 1024  # encode / decode of 1024 MiB (fp32) at 0.5 us/MiB
    e_chunk = 4 * ce / MIB * (1.0 - 0.5 * math.log(2) / math.log(16))  # 128 MiB: interpolated
    assert kc.kernel_us("encode", 8, False, ce) == pytest.approx(e_chunk)
    reduce_codec = e_full + e_full  # encode the message, decode W copies of the own chunk
    gather_codec = e_chunk + e_full  # encode the own chunk, decode all W chunks
    lk_r, lk_g = rs / 100e9 * 1e6, ag / 100e9 * 1e6
    p = cm.predict("two_step", n, W, link, kc, 8, 8)
    assert p.serial_us == pytest.approx(lk_r + reduce_codec + lk_g + gather_codec + 2 * 2.0)
    want = (
        max(lk_r, reduce_codec)
        + min(lk_r, reduce_codec) / 4
        + max(lk_g, gather_codec)
        + min(lk_g, gather_codec) / 4
        + 2 * 2.0
    )
    assert p.overlap_us == pytest.approx(want)

    nccl = cm.nccl_ring(n, 2, W, link, kc)
    wire = 2 * (W - 1) * (n // W) * 2
    mem = 2 * (W - 1) * 3 * (n // W) * 2 / (kc.hbm_gbps(2 * n) * 1e9) * 1e6
    assert nccl.overlap_us == pytest.approx(max(wire / 100e9 * 1e6, mem) + 14 * 2.0)
    assert nccl.serial_us == pytest.approx(wire / 100e9 * 1e6 + mem + 14 * 2.0)


def test_ring_pays_more_steps_than_semi_ring(costs):
    n = 16 * MIB // 2
    link = cm.Link("nvlink", 370, alpha_us=3.0)
    ring = cm.predict("ring", n, 8, link, costs)
    semi = cm.predict("semi_ring", n, 8, link, costs)
    assert ring.wire_bytes == semi.wire_bytes
    assert ring.latency_us == pytest.approx((7 + 1) * 3.0)
    assert semi.latency_us == pytest.approx((4 + 1) * 3.0)


def run_cli(*args):
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "cost_model.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_cli_prints_both_links(tmp_path):
    md = tmp_path / "out.md"
    out = run_cli("--sizes-mib", "1,64", "--markdown", str(md))
    assert "PREDICTED" in out
    rows = [ln.split() for ln in out.splitlines() if ln.strip().startswith(("nvlink", "pcie"))]
    links = {r[0] for r in rows}
    assert links == {"nvlink", "pcie"}
    # 2 links x 2 sizes x 3 algorithms x 3 bit pairs
    assert len([r for r in rows if r[0] == "nvlink"]) == 18
    assert len([r for r in rows if r[0] == "pcie"]) == 18
    text = md.read_text()
    # the same rows twice: the times, then the speed-ups
    assert text.count("| nvlink |") == 2 * 18 and text.count("| pcie |") == 2 * 18
    assert max(len(line) for line in text.splitlines()) <= 100


def test_cli_uses_fused_two_step_rows(tmp_path):
    fused = [[mib, "fused_two_step", 8, "asym", 1000.0 * mib / 64, 0, 0] for mib in (64, 1024)]
    path = synthetic(tmp_path, fused)
    kc = cm.KernelCosts.from_csv(path)
    n = 64 * MIB // 4
    link = cm.Link("l", math.inf, alpha_us=0.0)
    assert cm.predict("two_step", n, 8, link, kc, 8, 8).serial_us == pytest.approx(1000.0)
    # only for the bits it measured; the other algorithms keep the encode/decode kernels
    assert cm.predict("two_step", n, 8, link, kc, 4, 4).serial_us != pytest.approx(1000.0)
    assert cm.predict("ring", n, 8, link, kc, 8, 8).serial_us != pytest.approx(1000.0)
    out = run_cli("--kernel-csv", path, "--sizes-mib", "64", "--links", "nvlink=370")
    assert "fused_two_step" in out
    out = run_cli("--sizes-mib", "64", "--links", "nvlink=370")
    assert "fused_two_step" not in out
    # the separate kernels over CUDA IPC, measured whole, serve the same way when no fused row is
    # there; a fused row of the same bits comes first
    sep = [[mib, "separate_two_step", 8, "asym", 500.0 * mib / 64, 0, 0] for mib in (64, 1024)]
    kc = cm.KernelCosts.from_csv(synthetic(tmp_path, sep))
    assert cm.predict("two_step", n, 8, link, kc, 8, 8).serial_us == pytest.approx(500.0)
    out = run_cli("--kernel-csv", synthetic(tmp_path, sep), "--sizes-mib", "64")
    assert "'separate_two_step' rows" in out and "'fused_two_step'" not in out
    kc = cm.KernelCosts.from_csv(synthetic(tmp_path, sep + fused))
    assert cm.predict("two_step", n, 8, link, kc, 8, 8).serial_us == pytest.approx(1000.0)
