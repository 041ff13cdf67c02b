"""The package's metadata agrees with itself: one version in qcomm.__version__, pyproject.toml and
setup.py, the py.typed marker shipped with the package, and the autoload hook torch calls for an
installed qcomm (qcomm_autoload.py; scripts/install_check.sh checks it in an installed copy)."""

import os
import re
import subprocess
import sys

import qcomm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(name):
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def test_one_version_everywhere():
    assert re.fullmatch(r"\d+\.\d+\.\d+", qcomm.__version__), qcomm.__version__
    assert f'version = "{qcomm.__version__}"' in _read("pyproject.toml")
    assert f'version="{qcomm.__version__}"' in _read("setup.py")


def test_py_typed_is_shipped():
    assert os.path.exists(os.path.join(os.path.dirname(qcomm.__file__), "py.typed"))
    assert '"py.typed"' in _read("setup.py") and '"py.typed"' in _read("pyproject.toml")


_AUTOLOAD = """
import sys, tempfile
import torch.distributed as dist
import qcomm_autoload

qcomm_autoload.register()  # what torch's autoload calls for an installed qcomm
assert hasattr(dist.Backend, "QNCCL") and "qcomm" not in sys.modules  # registered, not loaded
dist.init_process_group("qnccl", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
import qcomm

qcomm_autoload.register()  # a second call (and qcomm's own registration) changes nothing
print(type(qcomm.backend_of()).__name__, qcomm.get_config().algorithm)
dist.destroy_process_group()
"""


def test_the_autoload_hook_registers_qnccl_lazily():
    out = subprocess.run(
        [sys.executable, "-c", _AUTOLOAD],
        env={**os.environ, "PYTHONPATH": ROOT, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "QncclBackend auto", out.stdout
    entry = 'qcomm = "qcomm_autoload:register"'
    assert entry in _read("pyproject.toml") and "qcomm = qcomm_autoload:register" in _read(
        "setup.py"
    )
