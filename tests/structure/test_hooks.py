"""The test hooks stay out of the product (issue 47): qcomm._C, the module users import, has no
`_testing`; the hooks are their own extension module, qcomm._testing (csrc/testing/), built for
the tests only (QCOMM_TEST_HOOKS=1, scripts/setup.sh) and linked against that _C, so that both
share one copy of its code and state; and the benchmarks call the public API, never a hook."""

import os
import subprocess
import sys

import qcomm
import qcomm._testing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_users_module_has_no_test_hooks():
    assert not hasattr(qcomm._C, "_testing")
    for hook in ("live_backends", "set_tune_timing_factors", "ipc_separate_emulate"):
        assert hasattr(qcomm._testing, hook) and not hasattr(qcomm._C, hook), hook


def test_the_hooks_are_a_module_of_their_own_linked_against_c():
    hooks, c = qcomm._testing.__file__, qcomm._C.__file__
    assert os.path.dirname(hooks) == os.path.dirname(c) and hooks != c
    assert os.path.basename(hooks).startswith("_testing.")
    # the hooks' own sources only: the product's code is _C's, loaded once
    needed = subprocess.run(["readelf", "-d", hooks], capture_output=True, text=True).stdout
    runpath = [line for line in needed.splitlines() if "(RUNPATH)" in line or "(RPATH)" in line]
    assert f"[{os.path.basename(c)}]" in needed, needed
    assert runpath and "$ORIGIN" in runpath[0].split("[")[1].split("]")[0].split(":"), runpath
    assert os.path.getsize(hooks) < os.path.getsize(c)


_COUNT = """
import sys, tempfile
import qcomm._testing as hooks  # first: it imports qcomm._C itself
import torch, torch.distributed as dist

before = hooks.live_backends()
dist.init_process_group("qnccl", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
during = hooks.live_backends()
x = torch.ones(8)
dist.all_reduce(x)
dist.destroy_process_group()
print(before, during, hooks.live_backends(), bool(torch.equal(x, torch.ones(8))))
"""


def test_the_hooks_count_the_backends_that_c_creates():
    # live_backends reads QncclBackend's static count: there is one copy of it, the one that the
    # objects qcomm._C creates change
    out = subprocess.run(
        [sys.executable, "-c", _COUNT],
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1", "0", "True"], out.stdout


def test_the_benchmarks_call_no_test_hook():
    found = []
    for root, _, names in os.walk(os.path.join(ROOT, "benchmarks")):
        for n in names:
            path = os.path.join(root, n)
            try:
                with open(path, encoding="utf-8") as f:
                    if "_testing" in f.read():
                        found.append(os.path.relpath(path, ROOT))
            except UnicodeDecodeError:
                continue
    assert not found, f"benchmarks that name _testing: {found}"
