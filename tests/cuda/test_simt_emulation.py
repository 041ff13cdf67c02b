"""The CUDA kernels' own sources, run on the CPU by the SIMT emulator (tests/native/simt): the
codec kernels against the CPU codec bit for bit, and the separate kernels over CUDA IPC (the copy
and barrier kernels, csrc/cuda/ipc_kernels.cu) under the exchange's schedule, W ranks as threads.
This is how the kernel code is exercised on machines without a GPU (CI); scripts/gpu_check.sh
runs the same kernels on the device. Needs only g++ and the CUDA toolkit's headers (no nvcc, no
GPU). (The fused two_step experiment's kernel: tests/experiments/test_ipc_fused.py.)"""

import os
import re

import pytest
from checks import run_script

CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(CUDA_HOME, "include", "cuda_runtime.h")),
    reason=f"no CUDA headers under {CUDA_HOME}",
)


@pytest.fixture(scope="module")
def build_dir(simt_build_dir):
    return simt_build_dir


def _run(what, build_dir, *args, tsan=False):
    return run_script(
        "simt_check.sh", what, *args, QCOMM_SIMT_DIR=build_dir, SIMT_TSAN="1" if tsan else "0"
    )


def test_emulator_runs_known_kernels(build_dir):
    rc, out = _run("self", build_dir, "ok")
    assert rc == 0 and "selftest ok" in out, out[-4000:]


@pytest.mark.parametrize(
    "bug,message",
    [
        ("divergent", "meet at different warp operations"),
        ("exit", "warp operation with exited lanes"),
        ("deadlock", "waits at a barrier that cannot complete"),
        ("named", "meet at one named barrier with different counts"),
        ("unwaited", "exited with asynchronous copies it never waited for"),
        ("outside", "cp.async to outside the block's dynamic shared memory"),
    ],
)
def test_emulator_refuses_what_a_gpu_would_hang_or_corrupt_on(build_dir, bug, message):
    rc, out = _run("self", build_dir, bug)
    assert rc != 0 and message in out, out[-4000:]


def test_codec_kernels_match_cpu_codec_under_emulation(build_dir):
    rc, out = _run("codec", build_dir)
    assert rc == 0 and "differences" in out, out[-4000:]
    assert "all " in out and "bit-identical to the CPU codec" in out, out[-4000:]
    # the launch variants the settings force (QCOMM_CUDA_ENCODE_BLOCKS=4 and 3,
    # QCOMM_CUDA_FULL_GRID=1 alone and with 4 encoder blocks, QCOMM_CUDA_FULL_GRID=0 with
    # QCOMM_CUDA_ENCODE_BLOCKS=3, both "auto"): the same bytes, and cuda/tuning.h's choices as the
    # settings say (the driver reloads the cached settings after each change)
    assert re.search(r"launch variants \(4 encode blocks, .*\): \d+ cases, 0 differences", out), out
    # the sum of W encoded copies in one kernel (two_step's owners): 1 to 11 blocks, 11 in two
    # launches; ignoring the second launch's accumulate makes every 11-block case differ; and the
    # same added to the owner's own values already in the output (accumulate from the first)
    assert "decode-sum: 126 cases, 0 differences" in out, out[-4000:]
    # the ring hop, fused and unfused (raw phases), its fp32 partial aliasing the local input as
    # the rings keep their sums in place
    assert re.search(r"ring hop: \d+ cases, 0 differences", out), out[-4000:]
    # the asymmetric encoders' clamp skipped where codec.h asymCodesInRange allows: the test took
    # both sides (the driver fails otherwise; here so that a failure names it)
    assert re.search(r"asymmetric groups without the clamp: [1-9]\d*, with it: [1-9]\d*", out), out
    assert "simt:" not in out, out[-4000:]
    # a value a launch setting does not allow: the launch that reads it raises
    # std::invalid_argument naming the variable, the value and what is allowed (and writes nothing)
    assert "refused settings: 6 of 6 launches threw std::invalid_argument" in out, out[-4000:]
    assert "qcomm: invalid QCOMM_CUDA_FULL_GRID='2'; allowed: auto, 0, 1" in out, out[-4000:]


def test_exchange_kernels_deliver_every_byte_under_emulation(build_dir):
    # the copy and barrier kernels under the exchange's schedule: every byte where it belongs in
    # 5 calls (slots of several rounds and of one, read where it landed), and the barrier kernel
    # of a rank whose peer never comes gives up, naming the barrier
    rc, out = _run("exchange", build_dir)
    assert rc == 0, out[-4000:]
    assert out.count("every byte delivered") == 6, out[-4000:]  # 5 calls + summary
    assert "timed out in the separate kernels' barrier 0 of its call waiting for rank 2" in out
    # ranks whose calls differ: every rank stops in its first barrier, one names both
    # fingerprints, and the end check fills the messages with 0xFF
    assert out.count("exchange kernels, mismatch: rank ") == 3, out[-4000:]
    assert "plan fingerprint differs from rank" in out and "0badf00d" in out, out[-4000:]
    assert "simt:" not in out, out[-4000:]


# ---- ThreadSanitizer: every CUDA thread a TSan fiber, ordered only by barriers and atomics ----
# (a second build of the emulator and the kernels, 1.5 minutes of the suite's 2 cores: behind the
# `sanitizer` marker; run `-m sanitizer` after a change to csrc/cuda/ipc_kernels.cu or the emulator)


@pytest.mark.sanitizer
def test_emulator_under_tsan_reports_a_missing_barrier(build_dir):
    rc, out = _run("self", build_dir, "ok", tsan=True)
    assert rc == 0 and "selftest ok" in out and "ThreadSanitizer" not in out, out[-4000:]
    rc, out = _run("self", build_dir, "race", tsan=True)
    assert rc != 0 and "ThreadSanitizer: data race" in out, out[-4000:]


@pytest.mark.sanitizer
def test_exchange_kernels_have_no_data_race(build_dir):
    # the copy and barrier kernels, every CUDA thread a TSan fiber: their ranks ordered only by
    # the barrier flags
    rc, out = _run("exchange", build_dir, tsan=True)
    assert rc == 0 and "ThreadSanitizer" not in out, out[-4000:]
    assert out.count("every byte delivered") == 6, out[-4000:]
