"""qcomm: a torch.distributed backend, ``qnccl``, whose allreduce sends 4- to 8-bit data.

``import qcomm`` registers the backend; then ``torch.distributed.init_process_group("qnccl")`` (or
``new_group(..., backend="qnccl")``) gives a group whose eligible allreduces are quantized on the
wire and whose every other collective passes through exactly to Gloo (CPU tensors) or NCCL (CUDA).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket

import torch
import torch.distributed as dist

from . import _C, _tuning, codec  # noqa: F401 (codec: API)
from .config import ALGORITHMS, ENV_VARS, QuantConfig, from_env, resolve  # noqa: F401 (API)

__version__ = (
    "0.1.0"  # pyproject.toml and setup.py carry the same (tests/structure/test_package.py)
)

__all__ = [
    "QuantConfig",
    "BACKEND",
    "get_config",
    "set_config",
    "stats",
    "reset_stats",
    "shadow",
    "release_buffers",
    "plan",
    "backend_of",
    "compiled_with_cuda",
    "cuda_transport",
    "cuda_ipc_profile",
    "cpu_isa",
    "cpu_isas",
    "set_cpu_isa",
    "settings",
    "reload_settings",
    "tune",
    "tuning",
    "tune_candidates",
    "plan_fingerprint",
    "codec",
]

BACKEND = "qnccl"


def compiled_with_cuda() -> bool:
    """True when the extension was built with its CUDA sources."""
    return _C.compiled_with_cuda()


def cpu_isa() -> str:
    """The instruction set whose CPU codec loops run: "generic" (baseline x86-64), "avx2" or
    "avx512"; QCOMM_CPU_ISA chooses, by default the widest this CPU has. The same bits from each."""
    return _C.cpu_isa()


def cpu_isas() -> list:
    """The instruction sets the CPU codec loops are compiled for that this CPU has, narrowest
    first."""
    return list(_C.cpu_isas())


def set_cpu_isa(name: str) -> str:
    """Runs the CPU codec loops of instruction set `name` from now on, in this process: "auto"
    (the widest this CPU has) or one of :func:`cpu_isas`, as QCOMM_CPU_ISA does at start; returns
    the one used before. The same bits from each; for comparing their speed."""
    return _C.set_cpu_isa(name)


def settings() -> list:
    """Every ``QCOMM_*`` setting the library reads, as declared in one place
    (csrc/common/settings.cpp): a list of dicts with its name, value now, source ("environment"
    or "default"), default, allowed values, a one-line doc, scope ("process": read at first use
    and kept; "group": read when a group is created or sets up its CUDA path) and the QuantConfig
    field it sets ("" when none). Raises ValueError, naming the variable, for an invalid value."""
    out = []
    for d in _C.setting_declarations():
        value = _C.setting(d["name"])
        out.append(
            {
                **d,
                "value": value["text"],
                "source": "environment" if value["from_environment"] else "default",
            }
        )
    return out


def reload_settings() -> None:
    """Forgets the process-scoped settings read so far (``scope`` "process" in :func:`settings`),
    so that each is read from the environment again at its next use: for a program that changes
    ``os.environ`` after a setting was read. Groups already created keep what they took."""
    _C.reload_settings()


_logged_settings = False


def _check_process_settings(rank: int, world: int) -> None:
    """Reads every process-scoped setting now, so that an invalid value is an error at the group's
    creation; with QCOMM_DEBUG=INFO (or CHECK), prints (once per process) each setting that
    differs from its default, where it came from and the default, as NCCL_DEBUG=INFO does."""
    global _logged_settings
    for d in _C.setting_declarations():
        if d["scope"] == "process":
            _C.setting(d["name"])
    _C.cpu_isa()  # an instruction set this CPU lacks is refused here, not at the first allreduce
    if _logged_settings or _C.setting("QCOMM_DEBUG")["text"] == "WARN":
        return
    _logged_settings = True
    for s in settings():
        if s["value"] != _C.parse_setting(s["name"], s["default"])["text"]:
            print(
                f"[qcomm rank {rank}/{world}] INFO {s['name']}={s['value']} (environment; "
                f"default {s['default']})",
                flush=True,
            )


def _agree_at_creation(store, rank: int, size: int, name: str) -> int:
    """The group setting `name` (a number), which every rank of the group must hold alike: each
    rank publishes its value through the group's store and reads the others'; a difference raises
    ValueError on every rank, naming the setting and each rank's value."""
    mine = _C.setting(name)["number"]
    key = f"qcomm_agree/{name}/"
    store.set(key + str(rank), str(mine))
    values = [store.get(key + str(r)).decode() for r in range(size)]
    if len(set(values)) > 1:
        held = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
        raise ValueError(
            f"[qcomm rank {rank}/{size}] {name} differs across the ranks of the group ({held}); "
            "set it alike on every rank"
        )
    return mine


def _agree_on_config(store, rank: int, size: int, cfg: QuantConfig) -> None:
    """Every rank must create the group with the same QuantConfig: a rank whose calls would pass
    through where its peers' are quantized (another min_bytes, algorithm or bits) would otherwise
    cost a timeout at the first such call. Each rank publishes its config through the group's
    store; a difference raises ValueError on every rank, naming the fields and each rank's value.
    (A later set_config agrees likewise: set_config.)"""
    key = "qcomm_agree/config/"
    store.set(key + str(rank), _config_text(cfg))
    held = _config_difference([store.get(key + str(r)).decode() for r in range(size)])
    if held:
        raise ValueError(
            f"[qcomm rank {rank}/{size}] the ranks create this group with different QuantConfigs "
            f"({held}); pass the same pg_options and QCOMM_* environment on every rank"
        )


def _config_text(cfg: QuantConfig) -> str:
    """A config as the ranks compare it: JSON of its fields."""
    return json.dumps(dataclasses.asdict(cfg), sort_keys=True)


def _config_difference(texts: list) -> str:
    """The fields in which every rank's config (`texts`, _config_text by rank) differs, with each
    rank's value: "min_bytes: rank 0: 1048576, rank 1: 65536"; "" when they agree."""
    every = [json.loads(t) for t in texts]
    differ = [f for f in every[0] if len({json.dumps(c[f]) for c in every}) > 1]
    return "; ".join(
        f"{f}: " + ", ".join(f"rank {r}: {c[f]!r}" for r, c in enumerate(every)) for f in differ
    )


def _agree_on_checks(store, rank: int, size: int) -> bool:
    """Whether the group's eager CUDA calls exchange their header on the host first
    (QCOMM_DEBUG=CHECK or TORCH_DISTRIBUTED_DEBUG=DETAIL): on every rank if on any. Ranks that
    differ would wait in different places, the checking ones in a host all-gather and the others
    in the CUDA-IPC barrier, until the group's timeout."""
    mine = _C.setting("QCOMM_DEBUG")["text"] == "CHECK" or (
        dist.get_debug_level() == dist.DebugLevel.DETAIL
    )
    key = "qcomm_agree/check_calls/"
    store.set(key + str(rank), "1" if mine else "0")
    return any(store.get(key + str(r)).decode() == "1" for r in range(size))


def _hosts(store, rank: int, size: int) -> list:
    """Every rank's host name, by rank, through the group's store."""
    key = "qcomm_host/"
    store.set(key + str(rank), socket.gethostname())
    return [store.get(key + str(r)).decode() for r in range(size)]


def _cpu_threads(hosts: list, rank: int) -> int:
    """The threads the codec of the group's quantized CPU allreduces uses: QCOMM_CPU_THREADS when
    set; else torch's intra-op thread count, but no more than this rank's share of the cores the
    process may run on, split among the group's ranks on this host (`hosts`: every rank's host
    name), so that ranks sharing a host do not oversubscribe it."""
    n = _C.setting("QCOMM_CPU_THREADS")["number"]
    if n:
        return n
    local = sum(h == hosts[rank] for h in hosts)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(torch.get_num_threads(), (cores or 1) // max(1, local)))


def _create(opts, pg_options):
    """The creator torch calls once per qnccl group (extended API).

    pg_options may be a QuantConfig (or a dict of its fields), or a ProcessGroupNCCL.Options, which
    Megatron-core passes when it has an NCCL communicator config: that goes to the inner NCCL
    backend, and the quantization config then comes from the environment and defaults."""
    nccl_options = None
    if dist.is_nccl_available() and isinstance(pg_options, dist.ProcessGroupNCCL.Options):
        nccl_options, pg_options = pg_options, None
    cfg = resolve(pg_options)
    store, rank, size, timeout = opts.store, opts.group_rank, opts.group_size, opts.timeout
    # an invalid process setting (QCOMM_CPU_ISA, ...) is an error here, at the group's creation, as
    # an invalid QCOMM_* config value is, not at its first allreduce
    _check_process_settings(rank, size)
    # the operator's switch: before any connection, so that ranks that disagree all raise here
    disabled = bool(_agree_at_creation(store, rank, size, "QCOMM_DISABLE"))
    _agree_on_config(store, rank, size, cfg)
    check_calls = _agree_on_checks(store, rank, size)
    hosts = _hosts(store, rank, size)
    threads = _cpu_threads(hosts, rank)
    # the addresses Gloo connected over are part of the tuning cache's key: a choice measured
    # over one network path is not used over another
    gloo, path = _tuning.connect_recording(
        lambda: dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, size, timeout)
    )
    nccl = None
    if torch.cuda.is_available() and dist.is_nccl_available():
        nopts = nccl_options if nccl_options is not None else dist.ProcessGroupNCCL.Options()
        nopts._timeout = timeout
        nopts.global_ranks_in_group = list(opts.global_ranks_in_group)
        nopts.group_name = opts.group_id
        nccl = dist.ProcessGroupNCCL(dist.PrefixStore("nccl", store), rank, size, nopts)
    # the store also carries the CUDA-IPC buffer handles (csrc/transport/cuda_ipc.cpp)
    ipc_store = dist.PrefixStore("qcomm", store)
    backend = _C.QncclBackend(
        rank, size, timeout, gloo, nccl, cfg.encoded(), ipc_store, disabled, threads, check_calls
    )
    if cfg.tune and cfg.algorithm == "auto" and not disabled and size > 1:
        paths = _tuning.agree_path(store, rank, size, path)
        key = _tuning.cache_key(cfg, size, hosts, threads, __version__, paths)
        _tuning.install(backend, store, rank, size, cfg, key, opts.group_id)
    return backend


def _register() -> None:
    # Registering twice asserts in some torch versions; importing qcomm twice must be harmless.
    if hasattr(dist.Backend, BACKEND.upper()):
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])


_register()


def backend_of(group=None) -> "_C.QncclBackend":
    """The qnccl backend object behind `group` (default: the default process group)."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    be = pg._get_backend(torch.device("cpu"))
    # TORCH_DISTRIBUTED_DEBUG=DETAIL wraps every backend of a group in a ProcessGroupWrapper
    be = getattr(be, "wrapped_pg", be)
    if not isinstance(be, _C.QncclBackend):
        raise ValueError(
            f"qcomm: the group's backend is {dist.get_backend(pg)!r}, not 'qnccl'; create it with "
            "backend='qnccl'"
        )
    return be


def set_config(config, group=None) -> None:
    """Replace a live group's configuration: a QuantConfig, or a dict of its fields (as
    pg_options takes). Collective: call it on every rank of the group, with the same config.

    It takes effect behind the calls issued on the group before it (it waits for them to run,
    each with the config it was issued under), and every call issued after it returns runs with
    the new config on every rank. The ranks compare their configs first: where they differ, it
    raises ValueError on every rank, naming each field and each rank's value, and every rank
    keeps its old config; a rank whose peers do not call it within the group's timeout raises
    RuntimeError naming them (that rank keeps its old config too)."""
    if isinstance(config, dict):
        config = QuantConfig(**config)
    if not isinstance(config, QuantConfig):
        raise TypeError(
            f"qcomm.set_config takes a QuantConfig or a dict of its fields, got "
            f"{type(config).__name__}"
        )
    be = backend_of(group)
    held = _config_difference(be.exchange_config(_config_text(config)))
    if held:
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        raise ValueError(
            f"[qcomm rank {pg.rank()}/{pg.size()}] set_config: the ranks set different "
            f"QuantConfigs ({held}); every rank keeps its old config. Call it on every rank of "
            "the group with the same config"
        )
    be.set_config(config.encoded())


def get_config(group=None) -> QuantConfig:
    """The live configuration of a qnccl group."""
    return QuantConfig.from_dict(backend_of(group).get_config())


def stats(group=None) -> dict:
    """Counters of this rank for `group`: quantized_calls, passthrough_calls (every collective that
    went to the inner backend), input_bytes and wire_bytes (bytes this rank sent) of the quantized
    allreduces, and their ratio compression; next_call_seq, the number the next allreduce that
    the config quantizes will carry (one the tuner passes through exactly counts too; it seeds
    stochastic rounding and picks the calls shadow mode shadows; it is not reset); buffer_bytes,
    what the group keeps allocated for its next host-memory allreduce (release_buffers frees it,
    as of the last call's end: stats never waits for a running call);
    cpu_threads, the threads the codec of its last quantized CPU allreduce could use
    (QCOMM_CPU_THREADS; 0 before the first); tuned_classes and tune_seconds, the size classes
    this rank measured (qcomm.tuning) and the time that took; checked_classes and check_seconds,
    the entries loaded from the tuning cache that the check at their first call confirmed, and
    the time the checks took; retuned_classes, the classes measured again because that check or
    the comparison with their real calls disagreed with the table; shadow (QuantConfig.shadow): per
    "<dtype> <size class>", the shadowed calls, the mean and largest relative L2 error of their
    quantized results against the exact allreduce, the largest absolute error of an element, and
    the seconds the exact runs and comparisons took. by_collective: the same counters per
    collective ("all_reduce", "reduce_scatter", "all_gather"), each with its compression: every
    call of each form (single, coalesced, list; torch's functional collectives included),
    quantized or passed through (the top-level passthrough_calls also counts every other
    operation: broadcast, barrier, all_to_all, ...)."""
    s = dict(backend_of(group).stats())
    s["compression"] = s["input_bytes"] / s["wire_bytes"] if s["wire_bytes"] else None
    from . import training  # the state of qcomm.feedback's and qcomm.delta's objects

    s["training"] = training.stats(group)
    for e in s["by_collective"].values():
        e["compression"] = e["input_bytes"] / e["wire_bytes"] if e["wire_bytes"] else None
    return s


def cuda_transport(group=None) -> dict:
    """The transport of the group's quantized CUDA allreduces: {"transport": "ipc" | "nccl" | "",
    "note": why IPC was not chosen, "kernels": how IPC runs two_step, "fused" | "separate"
    (QCOMM_IPC_KERNELS), "" without IPC}. "" until the group's first quantized CUDA allreduce
    (with QCOMM_CUDA_QUANTIZE=1) has chosen, on every rank alike."""
    be = backend_of(group)
    return {
        "transport": be.cuda_transport(),
        "note": be.cuda_transport_note(),
        "kernels": be.cuda_ipc_kernels(),
    }


def cuda_ipc_profile(group=None) -> dict:
    """Where this rank's fused CUDA-IPC two_step kernel spends its time, when QCOMM_IPC_PROFILE=1
    was set at the group's first quantized CUDA allreduce: {phase: clock cycles summed over the
    kernel's blocks since then, ..., "runs": block-pieces run}. Empty without it (or before the
    set-up, or with the NCCL transport). Synchronize the device first for final values."""
    return dict(backend_of(group).cuda_ipc_profile())


def release_buffers(group=None) -> int:
    """Frees the buffers the group keeps from one quantized CPU allreduce to the next (they grow to
    what its largest call needed, so that later calls fault in no fresh pages), after the call
    running now, if any; returns the bytes freed. The next call allocates afresh."""
    return backend_of(group).release_buffers()


def shadow(group=None, every: int = 1) -> None:
    """Shadow mode on `group` (call it on every rank, between collectives): every `every`-th
    quantized allreduce also runs the exact allreduce of a copy of its input and records the error
    of the quantized result in ``qcomm.stats(group)["shadow"]``; 0 turns it off. The same as
    ``set_config(get_config(group).replace(shadow=every), group)``. Host tensors only: quantized
    CUDA allreduces are not shadowed (the group warns once at its first CUDA call)."""
    set_config(get_config(group).replace(shadow=every), group)


def reset_stats(group=None) -> None:
    """Sets this rank's counters of `group` (qcomm.stats) back to zero; next_call_seq stays."""
    backend_of(group).reset_stats()


#: collective names of :func:`plan` and ``stats()["by_collective"]`` -> code (csrc/plan/plan.h)
COLLECTIVES = {"all_reduce": 0, "reduce_scatter": 1, "all_gather": 2}


def plan(tensor, op=dist.ReduceOp.SUM, group=None, collective="all_reduce") -> dict:
    """What a collective of `tensor` on `group` would do now: quantize or pass through (and why),
    the algorithm, bits and chunking. `collective`: "all_reduce" (of `tensor`), "reduce_scatter"
    (`tensor` is the input, W shards; the output is 1/W of it) or "all_gather" (`tensor` is the
    input shard; the output is W times it). A list of tensors: the coalesced form of the call
    (`all_reduce_coalesced`, funcol's `*_coalesced`), planned as the one packed message it
    becomes where its tensors are alike (one dtype and device, dense; a reduce-scatter's inputs W
    shards each)."""
    be = backend_of(group)
    world = dist.get_world_size(group)
    alike = True
    if isinstance(tensor, (list, tuple)):
        ts = list(tensor)
        if not ts:
            raise ValueError("qcomm.plan: an empty list of tensors")
        alike = all(
            t.dtype == ts[0].dtype and t.device == ts[0].device and t.layout == torch.strided
            for t in ts
        )
        if collective == "reduce_scatter":
            alike = alike and all(t.numel() % world == 0 for t in ts)
        tensor = (
            ts[0]
            if len(ts) == 1
            else torch.empty(
                sum(t.numel() for t in ts) if alike else 0, dtype=ts[0].dtype, device=ts[0].device
            )
        )
        alike = alike or len(ts) == 1
    if collective == "all_reduce":
        d = dict(be.plan(tensor, op, alike=alike))
        d["collective"] = collective
        return d
    if collective not in COLLECTIVES:
        raise ValueError(
            f"qcomm.plan: collective must be one of {', '.join(COLLECTIVES)}, got {collective!r}"
        )
    flat = tensor.reshape(-1)
    if collective == "reduce_scatter":
        message, shard = flat, flat[: max(0, flat.numel() // world)]
        if flat.numel() % world:
            shard = torch.empty(flat.numel() // world + 1, dtype=tensor.dtype)
    else:
        shard, message = flat, torch.empty(flat.numel() * world, dtype=tensor.dtype)
        op = dist.ReduceOp.SUM
    return dict(be.plan_sharded(COLLECTIVES[collective], message, shard, op, alike=alike))


def plan_fingerprint(
    numel: int, dtype=torch.float32, config=None, average: bool = False, call_seq: int = 0, world=2
) -> int:
    """The 32-bit fingerprint of the plan of an allreduce (SUM, or AVG with `average`) of
    `numel` elements of `dtype` on `world` ranks with `config` (a QuantConfig, or its
    ``encoded()`` dict; default ``QuantConfig()``), as call number `call_seq`: what the ranks of
    a quantized CUDA call over CUDA IPC compare in its first barrier kernel instead of exchanging
    the plan's header (docs/architecture.md). Equal plans, equal fingerprints."""
    if not isinstance(config, dict):
        config = (config or QuantConfig()).encoded()
    return _C.plan_fingerprint(config, numel, dtype, average, call_seq, world)


def tune_candidates(world: int, collective: str = "all_reduce", stream_ordered=False) -> list:
    """What the tuner times against the exact call for `collective` ("all_reduce",
    "reduce_scatter", "all_gather") on `world` ranks, in its order: "exact", then
    "<algorithm>/<microshards>" (the names of :func:`tuning`'s ``choice``). `stream_ordered`:
    those of CUDA tensors, whose transports move chunks whole (microshards change nothing)."""
    if collective not in COLLECTIVES:
        raise ValueError(
            f"qcomm.tune_candidates: collective must be one of {', '.join(COLLECTIVES)}, "
            f"got {collective!r}"
        )
    return list(_C.tune_candidates(world, stream_ordered, COLLECTIVES[collective]))


def tune(
    group=None, sizes=None, dtypes=(torch.float32,), device="cpu", collectives=("all_reduce",)
) -> list:
    """Measures now, on every rank of `group` (call it on all of them, with the same arguments),
    which of the exact collective and the quantized candidates is fastest for each size (bytes of
    the message: an allreduce's tensor, a reduce-scatter's input, an all-gather's output; by
    default the powers of two from the group's min_bytes to 64 MiB), dtype and collective
    ("all_reduce", "reduce_scatter", "all_gather") of host-memory calls, and enters each choice in
    the group's tuning table, replacing an earlier one; calls of that collective, dtype and size
    class then follow it. With the config's ``tune``, rank 0 also writes the table to the cache.
    Sizes below min_bytes pass through exactly and are not measured, and so do the sharded
    collectives the config does not quantize (``reduce_scatter``, ``all_gather``). The group's
    algorithm must be ``auto``. The tuner is for host memory only (`device` "cpu"): a CUDA
    allreduce with ``auto`` runs two_step. Returns :func:`tuning`."""
    if torch.device(device).type != "cpu":
        raise ValueError(
            f"qcomm.tune: the tuner measures host-memory allreduces only (device 'cpu', got "
            f"{device!r}); a CUDA allreduce with algorithm='auto' runs two_step"
        )
    if isinstance(collectives, str):
        collectives = (collectives,)
    for c in collectives:
        if c not in COLLECTIVES:
            raise ValueError(f"qcomm.tune: collectives are {', '.join(COLLECTIVES)}, got {c!r}")
    be = backend_of(group)
    cfg = get_config(group)
    world = dist.get_world_size(group)
    on = {"all_reduce": True, "reduce_scatter": cfg.reduce_scatter, "all_gather": cfg.all_gather}
    if sizes is None:
        sizes, n = [], max(cfg.min_bytes, 1 << 10)
        n = 1 << (n - 1).bit_length()
        while n <= 64 << 20:
            sizes.append(n)
            n <<= 1
    gen = torch.Generator().manual_seed(0)
    for dtype in dtypes:
        if dtype not in _tuning.CODES:
            raise ValueError(
                f"qcomm.tune: dtype {dtype} is not quantized; float32, float16 or bfloat16"
            )
        width = torch.empty((), dtype=dtype).element_size()
        for size in sizes:
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise ValueError(f"qcomm.tune: sizes are byte counts > 0, got {size!r}")
            for c in collectives:
                # a sharded call's message is W shards alike
                numel = (
                    max(1, size // width)
                    if c == "all_reduce"
                    else max(1, size // width // world) * world
                )
                if numel * width < cfg.min_bytes or not on[c]:
                    continue
                be.tune(torch.randn(numel, generator=gen).to(dtype=dtype), COLLECTIVES[c])
    return tuning(group)


_tune = tune  # what qcomm.tune still calls once ``import qcomm.tune`` (the CLI) has bound the name


def tuning(group=None, device="cpu") -> list:
    """The group's tuning table of host-memory calls, the same on every rank: one dict per
    collective ("all_reduce", "reduce_scatter", "all_gather"), dtype and size class with
    collective, dtype, size_class (k: messages of [2^k, 2^(k+1)) bytes), bytes (the
    size measured), choice ("exact" or "<algorithm>/<microshards>"), seconds (each candidate's
    time: the maximum over ranks of each rank's median) and verified (false for an entry loaded
    from the cache that the first call of its class has not checked yet). Device "cuda": an empty
    list (CUDA allreduces are not tuned)."""
    if torch.device(device).type == "cuda":
        return []
    return _tuning.table(backend_of(group))
