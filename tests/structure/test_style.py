"""What a reader can rely on in every file: no line over 100 characters in code or docs, and a
docstring on every public function and class of the Python package."""

import importlib
import inspect
import os
import pkgutil
import subprocess

import qcomm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKED = (".py", ".h", ".cpp", ".cu", ".cuh", ".sh", ".md", ".toml")


def _tracked():
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [
        f for f in out.splitlines() if f.endswith(CHECKED) and os.path.exists(os.path.join(ROOT, f))
    ]


def test_no_line_longer_than_100_characters():
    long = []
    for f in _tracked():
        with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
            for i, line in enumerate(fh, 1):
                if len(line.rstrip("\n")) > 100:
                    long.append(f"{f}:{i}: {len(line.rstrip())} characters")
    assert not long, f"{len(long)} lines over 100 characters:\n" + "\n".join(long[:40])


def _public(module):
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        if inspect.isfunction(obj) or inspect.isclass(obj):
            yield name, obj
            if inspect.isclass(obj):
                for m, f in vars(obj).items():
                    if not m.startswith("_") and inspect.isfunction(f):
                        yield f"{name}.{m}", f


def test_every_public_python_function_has_a_docstring():
    missing = []
    for info in pkgutil.iter_modules(qcomm.__path__):
        module = importlib.import_module(f"qcomm.{info.name}")
        for name, obj in _public(module):
            if not (obj.__doc__ or "").strip():
                missing.append(f"qcomm.{info.name}.{name}")
    for name, obj in _public(qcomm):
        if not (obj.__doc__ or "").strip():
            missing.append(f"qcomm.{name}")
    assert not missing, "public functions without a docstring:\n" + "\n".join(missing)
