"""The source tree keeps its layers (docs/architecture.md): every file of csrc/ sits in one layer's
folder and includes only its own layer and the layers below it; no algorithm names a concrete
transport and no transport includes an algorithm; the CUDA kernels include no torch header; and
the environment is read in one place, the settings reader."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSRC = os.path.join(ROOT, "csrc")

# bottom to top; experiments sits where an alternative algorithm-and-transport would; testing (the
# test hooks, a module of their own, tests/structure/test_hooks.py) above everything it pokes
LAYERS = [
    "common",
    "codec",
    "cuda",
    "plan",
    "transport",
    "algo",
    "experiments",
    "backend",
    "python",
    "testing",
]
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)
SOURCES = (".h", ".cpp", ".cu", ".cuh")


def _files(csrc=CSRC):
    for root, _, names in os.walk(csrc):
        for n in names:
            if n.endswith(SOURCES):
                yield os.path.relpath(os.path.join(root, n), csrc)


def _includes(rel, csrc=CSRC):
    with open(os.path.join(csrc, rel)) as f:
        return INCLUDE.findall(f.read())


def _layer(rel):
    return rel.split(os.sep)[0]


def test_every_source_is_in_a_layer_folder():
    stray = [f for f in _files() if os.sep not in f or _layer(f) not in LAYERS]
    assert not stray, f"files outside the layer folders: {stray}"
    assert set(LAYERS) <= set(os.listdir(CSRC)), sorted(os.listdir(CSRC))


def _upward(csrc=CSRC):
    wrong = []
    for f in _files(csrc):
        mine = LAYERS.index(_layer(f))
        for inc in _includes(f, csrc):
            top = inc.split("/")[0]
            if top in LAYERS and LAYERS.index(top) > mine:
                wrong.append(f"{f} includes {inc} ({top} is above {_layer(f)})")
    return wrong


def test_includes_point_down_only():
    wrong = _upward()
    assert not wrong, "\n".join(wrong)


def test_algorithms_name_no_concrete_transport_and_transports_no_algorithm():
    concrete = ("transport/c10d_transport.h", "transport/cuda_ipc.h", "transport/ipc_exchange.h")
    wrong = []
    for f in _files():
        for inc in _includes(f):
            if _layer(f) == "algo" and inc in concrete:
                wrong.append(f"{f} includes {inc}")
            if _layer(f) == "transport" and inc.startswith("algo/"):
                wrong.append(f"{f} includes {inc}")
    assert not wrong, "\n".join(wrong)


def test_cuda_kernels_include_no_torch():
    wrong = [
        f"{f} includes {inc}"
        for f in _files()
        if _layer(f) == "cuda"
        for inc in _includes(f)
        if inc.split("/")[0] in ("torch", "ATen", "c10", "pybind11")
    ]
    assert not wrong, "\n".join(wrong)


def test_the_environment_is_read_by_the_settings_reader_alone():
    readers = []
    for f in _files():
        with open(os.path.join(CSRC, f)) as fh:
            text = fh.read()
        if re.search(r"\bgetenv\s*\(", text):
            readers.append(f)
    assert readers == [os.path.join("common", "settings.cpp")], readers


def test_an_upward_include_is_caught(tmp_path):
    (tmp_path / "algo").mkdir()
    (tmp_path / "backend").mkdir()
    (tmp_path / "algo" / "x.cpp").write_text('#include "backend/y.h"\n#include "codec/z.h"\n')
    (tmp_path / "backend" / "y.h").write_text('#include "algo/x.h"\n')
    assert _upward(str(tmp_path)) == ["algo/x.cpp includes backend/y.h (backend is above algo)"]
