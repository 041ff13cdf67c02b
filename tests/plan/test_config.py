"""Configuration: validation messages, environment parsing, precedence, per-group settings."""

import dataclasses

import pytest
import torch
import torch.distributed as dist

import qcomm
from qcomm import _C, _testing, _tuning
from qcomm import config as qc

from dist_util import run_ranks


@pytest.mark.parametrize(
    "knob,value,allowed",
    [
        ("algorithm", "fast", "auto, two_step, ring, semi_ring, none"),
        ("rs_bits", 6, "4, 8 or None"),
        ("ag_bits", 16, "4, 8 or None"),
        ("rs_bits", True, "4, 8 or None"),
        ("group_size", 100, "power of two from 32 to 1024"),
        ("group_size", 2048, "power of two from 32 to 1024"),
        ("group_size", 16, "power of two from 32 to 1024"),
        ("symmetric", "yes", "True or False"),
        ("min_bytes", -1, "integer >= 0"),
        ("min_bytes", 1.5, "integer >= 0"),
        ("microshards", 0, "from 1 to 64"),
        ("microshards", 65, "from 1 to 64"),
        ("rotate", 1, "True, False or None (on for 4-bit phases)"),
    ],
)
def test_invalid_values_name_knob_value_and_allowed(knob, value, allowed):
    with pytest.raises(ValueError) as e:
        qcomm.QuantConfig(**{knob: value})
    msg = str(e.value)
    assert knob in msg and repr(value) in msg and allowed in msg


def test_defaults():
    c = qcomm.QuantConfig()
    assert (c.algorithm, c.rs_bits, c.ag_bits, c.group_size, c.symmetric) == (
        "auto",
        8,
        8,
        128,
        False,
    )
    assert c.min_bytes == 1 << 20 and c.microshards == 4


def test_environment_parsing():
    env = {
        "QCOMM_ALGO": "Ring",
        "QCOMM_RS_BITS": "4",
        "QCOMM_AG_BITS": "none",
        "QCOMM_GROUP_SIZE": "64",
        "QCOMM_SYMMETRIC": "true",
        "QCOMM_MIN_BYTES": "0",
        "QCOMM_MICROSHARDS": "2",
        "QCOMM_ROTATE": "on",
    }
    c = qc.from_env(env)
    assert c == qcomm.QuantConfig("ring", 4, None, 64, True, 0, 2, True)
    assert qc.from_env({}) == qcomm.QuantConfig()


@pytest.mark.parametrize(
    "var,value,allowed",
    [
        ("QCOMM_RS_BITS", "eight", "4, 8 or none"),
        ("QCOMM_RS_BITS", "6", "4, 8 or none"),
        ("QCOMM_SYMMETRIC", "maybe", "1/0, true/false, yes/no, on/off"),
        ("QCOMM_GROUP_SIZE", "99", "a power of two from 32 to 1024"),
        ("QCOMM_GROUP_SIZE", "2048", "a power of two from 32 to 1024"),
        ("QCOMM_ALGO", "tree", "auto, two_step, ring, semi_ring, none"),
        ("QCOMM_MIN_BYTES", "1k", "an integer >= 0"),
        ("QCOMM_MICROSHARDS", "65", "an integer from 1 to 64"),
        ("QCOMM_ROTATE", "maybe", "auto, or 1/0, true/false, yes/no, on/off"),
    ],
)
def test_invalid_environment(var, value, allowed):
    # the settings reader (csrc/common/settings.cpp) names the variable, the value, what is allowed
    with pytest.raises(ValueError) as e:
        qc.from_env({var: value})
    assert str(e.value) == f"qcomm: invalid {var}='{value}'; allowed: {allowed}"


def test_rotate_left_unset_rotates_where_a_phase_has_4_bits():
    # the rule: QuantConfig.rotates, the tuple the backend gets, and the reference alike
    for rs, ag, want in (
        (8, 8, False),
        (4, 8, True),
        (8, 4, True),
        (4, 4, True),
        (None, 8, False),
        (4, None, True),
        (None, None, False),
    ):
        c = qcomm.QuantConfig(rs_bits=rs, ag_bits=ag)
        assert c.rotate is None and c.rotates is want and c.encoded()["rotate"] == -1, (rs, ag)
    # resolved from the fields as they are: replace() turns it on and off
    c = qcomm.QuantConfig()
    assert c.replace(rs_bits=4).rotates and not c.replace(rs_bits=4).replace(rs_bits=8).rotates
    # an explicit value wins both ways
    assert not qcomm.QuantConfig(rs_bits=4, rotate=False).rotates
    assert qcomm.QuantConfig(rotate=True).rotates
    # QCOMM_ROTATE: unset or auto leaves it None; a boolean's spellings set it
    for raw, want in (("auto", None), ("AUTO", None), ("1", True), ("off", False), ("yes", True)):
        assert qc.from_env({"QCOMM_ROTATE": raw}).rotate is want, raw
    assert qc.from_env({}).rotate is None
    # the reference follows the same rule: rotate=None is rotate=True at 4 bits
    from qcomm import reference as ref

    xs = [torch.randn(1000, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    auto = ref.allreduce(xs, rs_bits=4, ag_bits=8).out
    assert torch.equal(auto, ref.allreduce(xs, rs_bits=4, ag_bits=8, rotate=True).out)
    assert not torch.equal(auto, ref.allreduce(xs, rs_bits=4, ag_bits=8, rotate=False).out)
    assert torch.equal(ref.allreduce(xs).out, ref.allreduce(xs, rotate=False).out)


def test_resolve_precedence_and_types(monkeypatch):
    explicit = qcomm.QuantConfig(rs_bits=4, tune=True)
    assert qc.resolve(explicit) is explicit
    # tune left None: QCOMM_TUNE decides (on when unset)
    for env, want in (("0", False), ("1", True), ("", True)):
        monkeypatch.setenv("QCOMM_TUNE", env)
        assert qc.resolve({"ag_bits": 4}) == qcomm.QuantConfig(ag_bits=4, tune=want)
        assert qc.resolve(None).tune is want
    with pytest.raises(TypeError, match="QuantConfig"):
        qc.resolve(42)


def test_cpp_validation_matches_python():
    # the C++ side rejects what Python rejects, even if Python's check is bypassed
    good = qcomm.QuantConfig().encoded()
    timeout = __import__("datetime").timedelta(seconds=5)
    for knob, value in (("rs_bits", 6), ("shadow", -1)):
        bad = {**good, knob: value}
        with pytest.raises(ValueError, match=knob):
            qcomm._C.QncclBackend(0, 1, timeout, None, None, bad)


def _precedence_worker(rank, world):
    out = {}
    out["default_group"] = qcomm.get_config()  # from the environment
    sub = dist.new_group([0, 1], backend="qnccl", pg_options=qcomm.QuantConfig(algorithm="ring"))
    out["explicit_group"] = qcomm.get_config(sub)
    qcomm.set_config(qcomm.QuantConfig(algorithm="semi_ring", ag_bits=4), group=sub)
    out["after_set"] = qcomm.get_config(sub)
    out["default_unchanged"] = qcomm.get_config()
    x = torch.ones(1000)
    out["plan"] = qcomm.plan(x, group=sub)
    out["plan_small"] = qcomm.plan(torch.ones(10))
    out["plan_int"] = qcomm.plan(torch.ones(10, dtype=torch.int32))
    out["plan_max"] = qcomm.plan(torch.ones(10**6), op=dist.ReduceOp.MAX)
    # Megatron-core passes NCCL options as pg_options when it has a communicator config
    nccl_opts = dist.ProcessGroupNCCL.Options()
    out["nccl_options_group"] = qcomm.get_config(
        dist.new_group([0, 1], backend="qnccl", pg_options=nccl_opts)
    )
    try:
        qcomm.set_config(qcomm.QuantConfig(), group=dist.new_group([0, 1], backend="gloo"))
        out["gloo_error"] = None
    except ValueError as e:
        out["gloo_error"] = str(e)
    return out


def test_precedence_across_ranks():
    env = {"QCOMM_RS_BITS": "4", "QCOMM_MIN_BYTES": "0", "QCOMM_ALGO": "two_step"}
    results = run_ranks(_precedence_worker, 2, env=env)
    for out in results:
        assert out["default_group"] == qcomm.QuantConfig(
            "two_step", rs_bits=4, min_bytes=0, tune=False
        )
        assert out["explicit_group"] == qcomm.QuantConfig(
            algorithm="ring", tune=False
        )  # explicit over env
        assert out["after_set"] == qcomm.QuantConfig(algorithm="semi_ring", ag_bits=4, tune=False)
        assert out["default_unchanged"] == out["default_group"]
        assert out["nccl_options_group"] == out["default_group"]  # from the environment
        # the subgroup keeps the default min_bytes (1 MiB), so 4000 bytes pass through
        assert out["plan"]["quantize"] is False and "min_bytes" in out["plan"]["reason"]
        assert out["plan_small"]["quantize"] is True and out["plan_small"]["rs_bits"] == 4
        assert out["plan_int"]["quantize"] is False and "dtype" in out["plan_int"]["reason"]
        assert out["plan_max"]["quantize"] is False and "op" in out["plan_max"]["reason"]
        assert "not 'qnccl'" in out["gloo_error"]


def test_one_spelling_rule_for_the_algorithm():
    # the environment's rule (any case) holds for QuantConfig too
    assert qcomm.QuantConfig(algorithm="RING") == qcomm.QuantConfig(algorithm="ring")
    assert qc.from_env({"QCOMM_ALGO": "Semi_Ring"}).algorithm == "semi_ring"
    with pytest.raises(ValueError, match="algorithm"):
        qcomm.QuantConfig(algorithm="TREE")


def _set_config_dict_worker(rank, world):
    qcomm.set_config({"algorithm": "ring", "rs_bits": 4})  # as pg_options takes it
    got = qcomm.get_config()
    try:
        qcomm.set_config(42)
        refused = None
    except TypeError as e:
        refused = str(e)
    return got, refused


def test_set_config_takes_a_dict_as_pg_options_does():
    for got, refused in run_ranks(_set_config_dict_worker, 1):
        assert got == qcomm.QuantConfig(algorithm="ring", rs_bits=4, tune=False), got
        assert "QuantConfig or a dict" in refused, refused


def test_the_dataclass_the_declaration_and_the_settings_agree():
    # csrc/plan/config.h QCOMM_CONFIG_FIELDS is the one declaration: the dataclass has exactly its
    # fields, in its order, with its defaults; every field has its QCOMM_* setting; a config
    # crosses to C++ and back by name, unchanged
    declared = _C.config_fields()
    names = [f["name"] for f in declared]
    assert names == [f.name for f in dataclasses.fields(qcomm.QuantConfig)]
    assert tuple(names) == qc.FIELDS
    encoded = qcomm.QuantConfig(tune=True).encoded()  # tune's Python default follows QCOMM_TUNE
    assert list(encoded) == names
    for f in declared:
        assert encoded[f["name"]] == f["default"], f
    assert sorted(qc.ENV_VARS.values()) == sorted(names)
    keyed = sorted(f["name"] for f in declared if f["tuning_key"])
    assert keyed == [
        "ag_bits",
        "group_size",
        "min_bytes",
        "rs_bits",
        "stochastic_rounding",
        "symmetric",
    ]
    cfg = qcomm.QuantConfig(algorithm="ring", rs_bits=4, ag_bits=None, rotate=False, shadow=3)
    assert _testing.config_round_trip(cfg.encoded()) == cfg.encoded()
    assert qcomm.QuantConfig.from_dict(cfg.encoded()) == cfg


def test_a_config_crosses_by_name_only():
    cfg = qcomm.QuantConfig().encoded()
    with pytest.raises(ValueError, match="passed as a dict"):
        _testing.config_round_trip(tuple(cfg.values()))
    with pytest.raises(ValueError, match="no field 'shadow'"):
        _testing.config_round_trip({k: v for k, v in cfg.items() if k != "shadow"})
    with pytest.raises(ValueError, match="unknown field 'bits'"):
        _testing.config_round_trip({**cfg, "bits": 8})


def test_the_tuning_key_follows_the_declaration():
    # every field declared as keying the table changes the cache key; the others do not
    base = qcomm.QuantConfig(tune=True)
    key = _tuning.cache_key(base, 2, ["h", "h"], 1, "v")
    changed = {
        "rs_bits": 4,
        "ag_bits": None,
        "group_size": 64,
        "symmetric": True,
        "min_bytes": 0,
        "stochastic_rounding": True,
        "shadow": 5,
        "microshards": 2,
        "reduce_scatter": True,
    }
    for name, value in changed.items():
        other = _tuning.cache_key(base.replace(**{name: value}), 2, ["h", "h"], 1, "v")
        keyed = name in {f["name"] for f in _C.config_fields() if f["tuning_key"]}
        assert (other != key) == keyed, name
