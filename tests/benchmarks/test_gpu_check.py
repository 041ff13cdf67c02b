"""scripts/gpu_check.sh and the benchmarks it runs, without a GPU: what they must not depend on
(the tuner, which needs NCCL where the thread-rank benchmarks have none)."""

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _read(*path):
    with open(os.path.join(ROOT, *path)) as f:
        return f.read()


def test_gpu_benchmarks_name_their_algorithm():
    # a QuantConfig left at algorithm="auto" tunes its first call of each size class; on CUDA
    # tensors the tuner's exact run needs NCCL, which the benchmark's thread ranks do not have
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
