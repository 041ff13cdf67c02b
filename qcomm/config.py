"""QuantConfig: every knob of a qnccl group, with validation and environment overrides.

Precedence: an explicit config (``pg_options`` at group creation, or :func:`qcomm.set_config` on a
live group) over ``QCOMM_*`` environment variables over the defaults below.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

from . import _C

#: algorithm name -> code shared with csrc/plan/config.h
ALGORITHMS = {"auto": 0, "two_step": 1, "ring": 2, "semi_ring": 3, "none": 4}
BITS = (4, 8, None)

#: environment variable -> QuantConfig field (the settings declared in csrc/common/settings.cpp
#: whose `field` is a QuantConfig field)
ENV_VARS = {d["name"]: d["field"] for d in _C.setting_declarations() if d["field"]}

Bits = Optional[int]


@dataclasses.dataclass(frozen=True)
class QuantConfig:
    """Configuration of a qnccl group's quantized allreduce.

    algorithm: ``auto`` (measured per size class where ``tune``, else two_step), ``two_step`` (Flash
        Communication), ``ring`` or ``semi_ring`` (EQuARX), or ``none`` (every allreduce passes
        through exactly).
    rs_bits / ag_bits: bits of the reduce phase and of the gather phase: 4, 8, or None (that phase
        ships the input dtype). Flash Communication's "INT6" is rs_bits=4, ag_bits=8.
    group_size: elements per quantization group (one scale each): a power of two, 32..1024.
    symmetric: True for absmax scaling (one fp32 per group); False for min/max scaling (scale and
        midpoint, two fp32 per group: a finer step for skewed groups).
    min_bytes: messages smaller than this pass through exactly (latency-bound, little to gain).
    microshards: pieces per chunk, so transfers overlap the codec (1..64); never changes the result.
    rotate: Hadamard-rotate each group before quantizing (and rotate back after): spreads outlier
        channels over their group, which matters most at 4 bits. The rotation is fused into the
        codec (each group is rotated on its way into the quantizer and back on its way out), so it
        costs two fast transforms per element and no pass or copy of its own (a zero-padded copy
        where the tensor does not end on a whole group). CPU and CUDA tensors. Left unset (None,
        the default): on when a phase has 4 bits, off otherwise (``rotates``): on a real model's
        activations 4-bit phases without it lose far more
        (benchmarks/results/04-smollm2-tensor-parallel.md).
    stochastic_rounding: round each code down after adding uniform noise, so the quantization
        error has mean zero over calls (for gradient traffic); still identical on every rank.
    tune: with algorithm ``auto``, the first allreduce of host tensors of each dtype and size
        class (a power of two of bytes, from min_bytes up) times the exact inner allreduce
        against the quantized candidates on this link and takes the fastest, exact unless a
        candidate is 5% faster; every rank takes rank 0's choice, kept in a cache file
        (QCOMM_TUNE_FILE) for later runs. False: ``auto`` is two_step. Left unset (None), it takes
        the QCOMM_TUNE setting when the QuantConfig is made: on unless that is 0. An explicit
        algorithm is never tuned over.
    shadow: every ``shadow``-th quantized allreduce (0: none) also runs the exact allreduce of a
        copy of its input through the inner backend and records the quantized result's relative
        L2 and maximum absolute error, per size class, in ``qcomm.stats()["shadow"]``; the caller
        still gets the quantized result. Costs one exact allreduce, a copy and a comparison per
        shadowed call.
    reduce_scatter: quantize ``reduce_scatter_tensor`` (and the list form ``reduce_scatter``)
        with the reduce phase's codec (``rs_bits``): SUM, AVG and PREMUL_SUM with a scalar factor
        (applied to the fp32 sum). Off by default. Rotated where ``rotate`` is True, or where
        it is None and ``rs_bits`` is 4 (each shard padded to whole groups on the way).
    all_gather: quantize ``all_gather_into_tensor`` (and the list form ``all_gather``) with the
        gather phase's codec (``ag_bits``), always rounding to nearest; every rank, the owner of
        each shard included, holds the decoded bytes. Off by default: it changes the values every
        rank computes with (weights in FSDP2, activations in Megatron's forward). Rotated where
        ``rotate`` is True, or where it is None and ``ag_bits`` is 4.
    """

    algorithm: str = "auto"
    rs_bits: Bits = 8
    ag_bits: Bits = 8
    group_size: int = 128
    symmetric: bool = False
    min_bytes: int = 1 << 20
    microshards: int = 4
    rotate: Optional[bool] = None
    stochastic_rounding: bool = False
    tune: Optional[bool] = None
    shadow: int = 0
    reduce_scatter: bool = False
    all_gather: bool = False

    #: torch's DeviceMesh reads ``pg_options._timeout`` from a ``(backend, pg_options)`` pair of
    #: ``backend_override`` (torch 2.11 ``_init_one_process_group``); None keeps the mesh's own
    #: timeout, so a QuantConfig can travel there.
    _timeout = None

    def __post_init__(self) -> None:
        # one rule for the algorithm's spelling, as the settings reader's: any case
        if isinstance(self.algorithm, str):
            object.__setattr__(self, "algorithm", self.algorithm.lower())
        if self.tune is None:  # the default: what QCOMM_TUNE says now (on unless 0)
            object.__setattr__(self, "tune", bool(_C.setting("QCOMM_TUNE")["number"]))
        validate(self)

    @property
    def rotates(self) -> bool:
        """Whether the codec rotates: ``rotate``, or where it is None, whether a phase has 4 bits
        (resolved from the fields as they are, so ``replace(rs_bits=4)`` turns it on; the plan's
        rule, csrc/plan/config.cpp rotates())."""
        if self.rotate is None:
            return self.rs_bits == 4 or self.ag_bits == 4
        return self.rotate

    def rotates_for(self, collective: str) -> bool:
        """Whether calls of `collective` ("all_reduce", "reduce_scatter", "all_gather") rotate,
        as their plan decides it (csrc/plan/plan.cpp rotatesCall): ``rotate`` where it is set, and
        for an allreduce; else a reduce-scatter rotates when the reduce phase has 4 bits and an
        all-gather when the gather phase has."""
        if self.rotate is not None or collective == "all_reduce":
            return self.rotates
        if collective not in ("reduce_scatter", "all_gather"):
            raise ValueError(f"unknown collective {collective!r}")
        return (self.rs_bits if collective == "reduce_scatter" else self.ag_bits) == 4

    def replace(self, **changes) -> "QuantConfig":
        """A copy with `changes` (field=value), validated."""
        return dataclasses.replace(self, **changes)

    def encoded(self) -> dict:
        """Every field by name, as the C++ side takes it (csrc/python/convert.h configFrom): the
        algorithm's code, bits 0 for None, rotate -1 for None (the rule of ``rotates``)."""
        out = {}
        for f in FIELDS:
            v = getattr(self, f)
            if f == "algorithm":
                v = ALGORITHMS[v]
            elif f in ("rs_bits", "ag_bits"):
                v = v or 0
            elif f == "rotate":
                v = -1 if v is None else int(v)
            out[f] = v
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "QuantConfig":
        """The inverse of encoded(): a config from the dict of every field by name."""
        names = {v: k for k, v in ALGORITHMS.items()}
        kw = {}
        for f in FIELDS:
            v = d[f]
            if f == "algorithm":
                v = names[v]
            elif f in ("rs_bits", "ag_bits"):
                v = v or None
            elif f == "rotate":
                v = None if v < 0 else bool(v)
            kw[f] = v
        return cls(**kw)


#: QuantConfig's fields in the order of their one declaration (csrc/plan/config.h
#: QCOMM_CONFIG_FIELDS); tests/plan/test_config.py checks the dataclass against it
FIELDS = tuple(f["name"] for f in _C.config_fields())


def _bad(knob: str, value, allowed: str) -> ValueError:
    return ValueError(f"qcomm: invalid {knob}={value!r}; allowed: {allowed}")


def validate(cfg: QuantConfig) -> None:
    """Raises ValueError naming the knob, the value and what is allowed for any invalid field."""
    if cfg.algorithm not in ALGORITHMS:
        raise _bad("algorithm", cfg.algorithm, ", ".join(ALGORITHMS))
    for knob in ("rs_bits", "ag_bits"):
        v = getattr(cfg, knob)
        if isinstance(v, bool) or v not in BITS:
            raise _bad(knob, v, "4, 8 or None (ship the input dtype)")
    g = cfg.group_size
    if isinstance(g, bool) or not isinstance(g, int) or g < 32 or g > 1024 or g & (g - 1):
        raise _bad("group_size", g, "a power of two from 32 to 1024")
    if not isinstance(cfg.symmetric, bool):
        raise _bad("symmetric", cfg.symmetric, "True or False")
    m = cfg.min_bytes
    if isinstance(m, bool) or not isinstance(m, int) or m < 0:
        raise _bad("min_bytes", m, "an integer >= 0")
    s = cfg.microshards
    if isinstance(s, bool) or not isinstance(s, int) or not 1 <= s <= 64:
        raise _bad("microshards", s, "an integer from 1 to 64")
    if cfg.rotate is not None and not isinstance(cfg.rotate, bool):
        raise _bad("rotate", cfg.rotate, "True, False or None (on for 4-bit phases)")
    if not isinstance(cfg.stochastic_rounding, bool):
        raise _bad("stochastic_rounding", cfg.stochastic_rounding, "True or False")
    if cfg.tune is not None and not isinstance(cfg.tune, bool):
        raise _bad("tune", cfg.tune, "True, False or None (QCOMM_TUNE decides)")
    v = cfg.shadow
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise _bad("shadow", v, "an integer >= 0 (0: off)")
    for knob in ("reduce_scatter", "all_gather"):
        if not isinstance(getattr(cfg, knob), bool):
            raise _bad(knob, getattr(cfg, knob), "True or False")


def _field_value(field: str, value: dict):
    """The QuantConfig value of a parsed setting (qcomm._C.setting / parse_setting)."""
    if field == "algorithm":
        return value["text"]
    if field in ("rs_bits", "ag_bits"):
        return value["number"] or None
    if field == "rotate":  # a choice: auto (None), or a boolean's spellings
        text = value["text"]
        return None if text == "auto" else text in ("1", "true", "yes", "on")
    if field in ("symmetric", "stochastic_rounding", "tune", "reduce_scatter", "all_gather"):
        return bool(value["number"])
    return int(value["number"])


def from_env(environ=None) -> QuantConfig:
    """The defaults overridden by any ``QCOMM_*`` variables that are set (and not empty), read by
    the settings reader (csrc/common/settings.h); `environ` (a mapping) stands in for the process
    environment. An invalid value raises ValueError naming the variable, the value and what is
    allowed."""
    changes = {}
    for var, field in ENV_VARS.items():
        if environ is None:
            value = _C.setting(var)
            if not value["from_environment"]:
                continue
        else:
            raw = environ.get(var, "")
            if raw == "":
                continue
            value = _C.parse_setting(var, raw)
        changes[field] = _field_value(field, value)
    try:
        return QuantConfig(**changes)
    except ValueError as e:
        raise ValueError(f"{e} (from the environment)") from None


def resolve(explicit: Union[QuantConfig, dict, None]) -> QuantConfig:
    """Explicit config over environment over defaults."""
    if explicit is None:
        explicit = from_env()
    if isinstance(explicit, dict):
        explicit = QuantConfig(**explicit)
    if isinstance(explicit, QuantConfig):
        return explicit
    raise TypeError(
        "qcomm: pg_options for a qnccl group must be a qcomm.QuantConfig (or a dict of its "
        "fields), "
        f"got {type(explicit).__name__}"
    )
