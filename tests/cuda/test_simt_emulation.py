"""The CUDA kernels' own sources, run on the CPU by the SIMT emulator (tests/native/simt): the
codec kernels against the CPU codec bit for bit, and the fused CUDA-IPC two_step kernel, W ranks
x B blocks of 256 threads, against the host emulation of its protocol. This is how the kernel
code is exercised on machines without a GPU (CI); scripts/gpu_check.sh runs the same kernels on
the device. Needs only g++ and the CUDA toolkit's headers (no nvcc, no GPU)."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(CUDA_HOME, "include", "cuda_runtime.h")),
    reason=f"no CUDA headers under {CUDA_HOME}",
)


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("simt"))


def _run(what, build_dir, *args, tsan=False):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # not under ASan's preload
    env.update(PYTHON=sys.executable, QCOMM_SIMT_DIR=build_dir, SIMT_TSAN="1" if tsan else "0")
    run = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "simt_check.sh"), what, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    return run.returncode, run.stdout + run.stderr


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
    # the launch variants (QCOMM_CUDA_PREFETCH=1, QCOMM_CUDA_ENCODE_BLOCKS=4, both,
    # QCOMM_CUDA_ENCODE_STAGED=1, QCOMM_CUDA_FULL_GRID=1, QCOMM_CUDA_DECODE_UNROLL=8,
    # QCOMM_CUDA_FULL_GRID=0 with QCOMM_CUDA_ENCODE_BLOCKS=3): the same bytes; the kernels did
    # prefetch, and only inside what they read
    assert re.search(r"launch variants .*: \d+ cases, 0 differences, [1-9]\d* addresses", out), out
    assert "prefetched, 0 outside the tensor read" in out, out[-4000:]
    # the sum of W encoded copies in one kernel (two_step's owners): 1 to 11 blocks, 11 in two
    # launches; ignoring the second launch's accumulate makes every 11-block case differ
    assert "decode-sum: 83 cases, 0 differences" in out, out[-4000:]
    # the asymmetric encoders' clamp skipped where codec.h asymCodesInRange allows: the test took
    # both sides (the driver fails otherwise; here so that a failure names it)
    assert re.search(r"asymmetric groups without the clamp: [1-9]\d*, with it: [1-9]\d*", out), out
    assert "simt:" not in out, out[-4000:]
    # a setting's value it does not understand: one warning, however many launches
    warning = "QCOMM_CUDA_ENCODE_STAGED='yes' is not understood (it takes 0, 1, or unset for the"
    assert out.count(warning) == 1, out[-4000:]
    warning = "QCOMM_CUDA_FULL_GRID='2' is not understood (it takes 0, 1, or unset for the"
    assert out.count(warning) == 1, out[-4000:]


def test_fused_two_step_kernel_matches_host_emulation(build_dir):
    rc, out = _run("ipc", build_dir)
    assert rc == 0, out[-4000:]
    assert out.count("identical to the host emulation") == 15, out[-4000:]  # 14 cases + summary
    # task groups of 1, 2 and 4 warps (QCOMM_IPC_TASK_WARPS): __syncwarp and named barriers
    for tw in (1, 2, 4):
        assert f"task_warps={tw} " in out, out[-4000:]
    # QCOMM_CUDA_PREFETCH=1 in some cases: each call checks that the kernel prefetched only inside
    # the inputs and that the host emulation encoded exactly the tiles named for prefetching
    assert "prefetch=1 " in out and "prefetch=0 " in out, out[-4000:]
    assert "every present rank gave up" in out, out[-4000:]
    assert "simt:" not in out, out[-4000:]
    # the separate kernels (QCOMM_IPC_KERNELS=separate): the copy and barrier kernels under the
    # exchange's schedule, every byte where it belongs in 5 calls (slots of several rounds and of
    # one, read where it landed), and the barrier kernel of a
    # rank whose peer never comes gives up, naming the barrier
    assert out.count("every byte delivered") == 6, out[-4000:]  # 5 calls + summary
    assert "timed out in the separate kernels' barrier 0 of its call waiting for rank 2" in out


# ---- ThreadSanitizer: every CUDA thread a TSan fiber, ordered only by barriers and atomics ----


def test_emulator_under_tsan_reports_a_missing_barrier(build_dir):
    rc, out = _run("self", build_dir, "ok", tsan=True)
    assert rc == 0 and "selftest ok" in out and "ThreadSanitizer" not in out, out[-4000:]
    rc, out = _run("self", build_dir, "race", tsan=True)
    assert rc != 0 and "ThreadSanitizer: data race" in out, out[-4000:]


def test_fused_two_step_kernel_has_no_data_race(build_dir):
    # W ranks x B blocks x 256 threads: a race between threads of one block (a missing
    # __syncwarp or __syncthreads) or between ranks (a flag that does not order a slot) fails it.
    # Removing either __syncwarp of DeviceExec::sumEncode makes it report one, as does removing
    # the __syncwarp or the named barrier of a task group of one or two warps
    # (DeviceExec::barrier).
    rc, out = _run("ipc", build_dir, "--quick", tsan=True)
    assert rc == 0 and "ThreadSanitizer" not in out, out[-4000:]
    assert out.count("identical to the host emulation") == 8, out[-4000:]  # 7 cases + summary
    assert "task_warps=1 " in out and "task_warps=2 " in out, out[-4000:]
    # and the separate kernels' copy and barrier kernels: their ranks ordered only by the flags
    assert out.count("every byte delivered") == 6, out[-4000:]
