"""The package's metadata agrees with itself: one version in qcomm.__version__, pyproject.toml and
setup.py, and the py.typed marker shipped with the package."""

import os
import re

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
