"""The SIMT emulator's build directory, one per test session: the kernels compiled as C++ take
minutes of CPU, so tests/cuda/test_simt_emulation.py and test_simt_schedules.py share their
objects (scripts/simt_check.sh rebuilds only what changed). QCOMM_SIMT_DIR, when set, names a
directory kept across sessions (one per checkout: the objects are those of its sources)."""

import os

import pytest


@pytest.fixture(scope="session")
def simt_build_dir(tmp_path_factory):
    return os.environ.get("QCOMM_SIMT_DIR") or str(tmp_path_factory.mktemp("simt"))
