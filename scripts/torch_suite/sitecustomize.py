"""Loaded at every Python start-up while scripts/torch_suite.sh runs one of torch's own test
files (it puts this folder first on PYTHONPATH and sets QCOMM_TORCH_SUITE_OUT): the process groups
those tests create on "gloo" are created on "qnccl" instead, and before a process destroys its
groups it writes what each qnccl group counted (qcomm.stats()["by_collective"], summed over the
groups) to QCOMM_TORCH_SUITE_OUT/stats-<pid>.json, which scripts/torch_suite/summary.py adds up.
Does nothing without QCOMM_TORCH_SUITE_OUT."""

import os

if os.environ.get("QCOMM_TORCH_SUITE_OUT"):
    import json

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    import qcomm

    _init, _destroy = dist.init_process_group, dist.destroy_process_group
    _totals: dict = {}

    def _on_qnccl(backend):
        if backend is None or str(backend).lower() in ("gloo", "cpu:gloo"):
            return "qnccl"
        return backend

    def init_process_group(backend=None, *args, **kwargs):
        return _init(_on_qnccl(backend), *args, **kwargs)

    def _collect():
        for pg in list(c10d._world.pg_map):  # the default group and every subgroup
            try:
                by = qcomm.stats(pg)["by_collective"]
            except (ValueError, RuntimeError):
                continue  # not a qnccl group (or one torch has already torn down)
            for name, e in by.items():
                t = _totals.setdefault(name, {"quantized_calls": 0, "passthrough_calls": 0})
                for k in t:
                    t[k] += int(e.get(k, 0))
        path = os.path.join(os.environ["QCOMM_TORCH_SUITE_OUT"], f"stats-{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump(_totals, f)

    def destroy_process_group(group=None):
        if group is None and c10d.GroupMember.WORLD is not None:
            _collect()  # cumulative: a later test in this process adds its groups' counts
        return _destroy(group)

    dist.init_process_group = c10d.init_process_group = init_process_group
    dist.destroy_process_group = c10d.destroy_process_group = destroy_process_group
