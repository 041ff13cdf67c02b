"""Megatron-core integration: quantize the tensor-parallel allreduces, keep every other group exact.

Use qnccl as the default process group, so that every group Megatron creates is a qnccl group that
passes through to Gloo/NCCL, then flag the tensor-parallel group::

    import torch.distributed as dist
    import qcomm, qcomm.megatron
    from megatron.core import parallel_state

    dist.init_process_group("qnccl", pg_options=qcomm.QuantConfig(algorithm="none"))
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=4)
    qcomm.megatron.quantize_tensor_parallel(qcomm.QuantConfig(rs_bits=4, ag_bits=8))

Why the call also sets the *other* groups: Megatron creates its groups with
``torch.distributed.new_group(...)`` and no ``pg_options``, so each qnccl group it creates starts
from the ``QCOMM_*`` environment / defaults (``algorithm="auto"``, quantize from 1 MiB), not from
the default group's config. ``quantize_tensor_parallel`` therefore sets ``algorithm="none"`` on
every other qnccl group this rank belongs to (Megatron's groups and the default group) unless
``exact_elsewhere=False``.

Megatron is imported inside the functions: ``import qcomm`` never needs it. Checked against
megatron-core 0.16.1 (``parallel_state.get_tensor_model_parallel_group``, groups tagged with
``group_desc`` such as ``"TENSOR_MODEL_PARALLEL_GROUP"``).
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional

import torch.distributed as dist

from . import BACKEND, set_config
from .config import QuantConfig

__all__ = ["quantize_tensor_parallel", "quantize_groups_by_desc", "EXACT"]

#: the config that makes a qnccl group pass every collective through exactly
EXACT = QuantConfig(algorithm="none")

#: Megatron's group_desc of the tensor-parallel group
TP_DESC = "TENSOR_MODEL_PARALLEL_GROUP"


def _is_qnccl(group) -> bool:
    return dist.get_backend(group) == BACKEND


def _member_groups() -> List[dist.ProcessGroup]:
    """Every process group this rank belongs to (the default group first)."""
    world = dist.distributed_c10d._world
    groups = [world.default_pg] if world.default_pg is not None else []
    for pg in world.pg_map:
        if pg is not None and pg not in groups and pg != dist.GroupMember.NON_GROUP_MEMBER:
            groups.append(pg)
    return groups


def quantize_tensor_parallel(
    config: QuantConfig,
    exact_elsewhere: bool = True,
    reduce_scatter: Optional[bool] = None,
    all_gather: Optional[bool] = None,
) -> Dict[str, int]:
    """Make this rank's Megatron tensor-parallel group quantize its allreduces with `config`.

    With ``sequence_parallel=True`` Megatron's TP traffic is reduce-scatters and all-gathers
    instead: `reduce_scatter` / `all_gather`, when given, override the config's fields of those
    names (``QuantConfig.reduce_scatter``: the RowParallel outputs and the sequence-parallel input
    gradients at ``rs_bits``; ``all_gather``: the activations gathered along the sequence at
    ``ag_bits``, which changes what the forward computes with).

    Call it on every rank after ``megatron.core.parallel_state.initialize_model_parallel(...)``,
    between collectives. With ``exact_elsewhere`` (the default) every other qnccl group this rank
    belongs to (data-parallel, pipeline, embedding, ..., and the default group) is set to
    ``algorithm="none"``: exact pass-through. Groups of other backends (Megatron's Gloo groups) are
    left alone; they are exact anyway.

    Raises ValueError when the tensor-parallel group is not a qnccl group (the default process
    group must be ``"qnccl"``, or Megatron must be told to create its TP group with it), and
    RuntimeError when model parallelism is not initialized. Returns how many groups were set to
    each kind: ``{"quantized": 1, "exact": n}``.
    """
    if not isinstance(config, QuantConfig):
        raise TypeError(f"qcomm: expected a QuantConfig, got {type(config).__name__}")
    if reduce_scatter is not None:
        config = config.replace(reduce_scatter=bool(reduce_scatter))
    if all_gather is not None:
        config = config.replace(all_gather=bool(all_gather))
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_group(check_initialized=False)
    if tp is None:
        raise RuntimeError(
            "qcomm: Megatron's tensor-parallel group does not exist yet; call "
            "megatron.core.parallel_state.initialize_model_parallel(...) first"
        )
    if not _is_qnccl(tp):
        raise ValueError(
            f"qcomm: Megatron's tensor-parallel group has backend {dist.get_backend(tp)!r}, not "
            f"{BACKEND!r}; initialize torch.distributed with init_process_group({BACKEND!r}, ...) "
            "before initialize_model_parallel so that Megatron's groups are qnccl groups"
        )
    counts = {"quantized": 0, "exact": 0}
    if exact_elsewhere:
        for pg in _member_groups():
            if pg is not tp and _is_qnccl(pg):
                set_config(EXACT, group=pg)
                counts["exact"] += 1
    set_config(config, group=tp)
    counts["quantized"] += 1
    return counts


def quantize_groups_by_desc(config: QuantConfig, descs: Iterable[str] = (TP_DESC,)) -> List[str]:
    """Set `config` on every qnccl group of this rank whose ``group_desc`` is in `descs` (e.g.
    ``"TENSOR_MODEL_PARALLEL_GROUP"``, ``"EXPERT_TENSOR_PARALLEL_GROUP"``); other groups are not
    touched. Call it on every rank. Returns the descs of the groups it set, in order."""
    wanted = set(descs)
    done = []
    for pg in _member_groups():
        if pg.group_desc in wanted and _is_qnccl(pg):
            set_config(config, group=pg)
            done.append(pg.group_desc)
    return done
