"""scripts/gpu_check.sh and the benchmarks it runs, without a GPU: what they must not depend on
(the tuner: a benchmark times the configuration it names, never a tuned choice)."""

import ast
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(*path):
    with open(os.path.join(ROOT, *path)) as f:
        return f.read()


def test_gpu_benchmarks_name_their_algorithm():
    # a QuantConfig left at algorithm="auto" is the tuner's choice (two_step on CUDA tensors
    # today, which are not tuned): a benchmark names what it times
    tree = ast.parse(_read("benchmarks", "ipc_two_step_bench.py"))
    configs = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "QuantConfig"
    ]
    assert configs
    for node in configs:
        algo = {k.arg: k.value for k in node.keywords}.get("algorithm")
        assert isinstance(algo, ast.Constant) and algo.value != "auto", ast.dump(node)


def test_gpu_check_turns_tuning_off():
    script = _read("scripts", "gpu_check.sh")
    assert re.search(r"^export QCOMM_TUNE=0$", script, re.M)


def test_gpu_check_dry_run_plans_the_new_code_first_within_8_minutes():
    out = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "gpu_check.sh"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if k != "DEADLINE"},
    ).stdout
    rows = re.findall(r"^\s*(\d+)\. (\S+)\s+(\d+)  ", out, re.M)
    keys = [key for _, key, _ in rows]
    caps = [int(cap) for _, _, cap in rows]
    assert [int(i) for i, _, _ in rows] == list(range(1, len(rows) + 1)), out
    assert sum(caps) < 8 * 60, out
    assert f"total of the caps: {sum(caps)} s" in out, out
    # the build first, then every item that has never run on a GPU, each its own step
    assert keys[:3] == ["machine", "build", "probe"], keys
    never_run = ["rings4", "rotated2", "sharded2", "mismatch", "abort", "graph", "rounds", "nccl1"]
    assert keys[3:] == never_run, keys
    # each planned step is run by the script under its key
    script = _read("scripts", "gpu_check.sh")
    for key in never_run:
        assert re.search(rf"^planned {key} ", script, re.M), key
