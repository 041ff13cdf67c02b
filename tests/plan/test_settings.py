"""The settings reader (csrc/common/settings.h): every QCOMM_* variable is declared once, read by
one reader, refused with a ValueError naming the variable, the value and what is allowed, and
documented from its declaration (docs/settings.md; the README's configuration table)."""

import os
import re
import subprocess
import sys

import pytest

import qcomm
from qcomm import _C

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import settings_table  # noqa: E402


def test_docs_list_every_setting_as_declared():
    with open(settings_table.DOC) as f:
        doc = f.read()
    block = doc.split(settings_table.BEGIN, 1)[1].split(settings_table.END, 1)[0].strip()
    assert block == settings_table.table(), "docs/settings.md is stale: scripts/settings_table.py"


def test_readme_configuration_table_matches_the_declarations():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    rows = {}
    for line in readme.splitlines():
        m = re.match(r"\| `(\w+)` \| `(QCOMM_\w+)` \| `([^`]*)` \|", line)
        if m:
            rows[m.group(2)] = (m.group(1), m.group(3))
    declared = {d["name"]: d for d in _C.setting_declarations() if d["field"]}
    assert set(rows) == set(declared), (sorted(rows), sorted(declared))
    for name, (field, default) in rows.items():
        d = declared[name]
        assert field == d["field"], name
        want = qcomm.QuantConfig().__getattribute__(field)
        if field == "tune":  # QuantConfig() takes QCOMM_TUNE, which the suite sets to 0
            want = bool(int(d["default"]))
        assert default == str(want), (name, default, want)


def test_settings_lists_values_and_sources(monkeypatch):
    monkeypatch.setenv("QCOMM_RS_BITS", "4")
    monkeypatch.delenv("QCOMM_AG_BITS", raising=False)
    s = {x["name"]: x for x in qcomm.settings()}
    assert s["QCOMM_RS_BITS"]["value"] == "4" and s["QCOMM_RS_BITS"]["source"] == "environment"
    assert s["QCOMM_AG_BITS"]["value"] == "8" and s["QCOMM_AG_BITS"]["source"] == "default"
    assert s["QCOMM_RS_BITS"]["scope"] == "group" and s["QCOMM_CPU_ISA"]["scope"] == "process"
    assert all(x["doc"] and x["allowed"] for x in s.values())
    assert set(qcomm.ENV_VARS) == {n for n, x in s.items() if x["field"]}


@pytest.mark.parametrize(
    "name,raw,allowed",
    [
        ("QCOMM_TRANSPORT", "fast", "auto, ipc, nccl"),
        ("QCOMM_IPC_BUFFER_MB", "0", "an integer from 1 to 65536"),
        ("QCOMM_IPC_BUFFER_MB", "lots", "an integer from 1 to 65536"),
        ("QCOMM_CUDA_QUANTIZE", "2", "1/0, true/false, yes/no, on/off"),
        ("QCOMM_CUDA_FULL_GRID", "2", "auto, 0, 1"),
        ("QCOMM_DEBUG", "LOUD", "WARN, INFO, CHECK"),
        ("QCOMM_GROUP_SIZE", "96", "a power of two from 32 to 1024"),
    ],
)
def test_an_invalid_value_is_a_value_error_naming_it(name, raw, allowed):
    with pytest.raises(ValueError) as e:
        _C.parse_setting(name, raw)
    assert str(e.value) == f"qcomm: invalid {name}='{raw}'; allowed: {allowed}"


def test_values_are_canonical():
    assert _C.parse_setting("QCOMM_ALGO", " Semi_Ring ")["text"] == "semi_ring"
    assert _C.parse_setting("QCOMM_SYMMETRIC", "Yes")["number"] == 1
    assert _C.parse_setting("QCOMM_RS_BITS", "none")["number"] == 0
    assert _C.parse_setting("QCOMM_DEBUG", "info")["text"] == "INFO"
    with pytest.raises(ValueError, match="no setting named QCOMM_NOPE"):
        _C.parse_setting("QCOMM_NOPE", "1")


def test_process_settings_are_read_once_group_settings_each_time(monkeypatch):
    monkeypatch.setenv("QCOMM_CUDA_FULL_GRID", "1")
    monkeypatch.setenv("QCOMM_TRANSPORT", "nccl")
    qcomm.reload_settings()
    try:
        assert _C.setting("QCOMM_CUDA_FULL_GRID")["text"] == "1"
        assert _C.setting("QCOMM_TRANSPORT")["text"] == "nccl"
        monkeypatch.setenv("QCOMM_CUDA_FULL_GRID", "0")
        monkeypatch.setenv("QCOMM_TRANSPORT", "ipc")
        assert _C.setting("QCOMM_CUDA_FULL_GRID")["text"] == "1"  # kept for the process
        assert _C.setting("QCOMM_TRANSPORT")["text"] == "ipc"  # read afresh
        qcomm.reload_settings()
        assert _C.setting("QCOMM_CUDA_FULL_GRID")["text"] == "0"
    finally:
        monkeypatch.delenv("QCOMM_CUDA_FULL_GRID")
        qcomm.reload_settings()


_GROUP = (
    "import tempfile, torch.distributed as dist, qcomm\n"
    "dist.init_process_group('qnccl', init_method='file://' + tempfile.mktemp(), rank=0,\n"
    "                        world_size=1)\n"
    "dist.destroy_process_group()\n"
    "print('created')\n"
)


def _create_group(env):
    out = subprocess.run(
        [sys.executable, "-c", _GROUP],
        env={**os.environ, "PYTHONPATH": ROOT, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.returncode, out.stdout + out.stderr


def test_debug_info_prints_what_differs_from_the_default_and_a_bad_one_fails_creation():
    rc, out = _create_group({"QCOMM_DEBUG": "INFO", "QCOMM_MIN_BYTES": "0"})
    assert rc == 0, out
    assert "[qcomm rank 0/1] INFO QCOMM_MIN_BYTES=0 (environment; default 1048576)" in out, out
    assert "[qcomm rank 0/1] INFO QCOMM_DEBUG=INFO (environment; default WARN)" in out, out
    assert "QCOMM_RS_BITS" not in out  # not set: not printed
    rc, out = _create_group({"QCOMM_DEBUG": "INFO", "QCOMM_RS_BITS": "8"})
    assert rc == 0 and "QCOMM_RS_BITS" not in out, out  # set to its default: not printed
    rc, out = _create_group({"QCOMM_MIN_BYTES": "0"})
    assert rc == 0 and "INFO" not in out, out
    rc, out = _create_group({"QCOMM_CUDA_ENCODE_BLOCKS": "5"})
    assert rc != 0 and "qcomm: invalid QCOMM_CUDA_ENCODE_BLOCKS='5'; allowed: auto, 3, 4" in out
