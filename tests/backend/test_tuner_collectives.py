"""The tuner per collective (csrc/backend/tuner.cpp, plan/tuning.h, qcomm/_tuning.py): `auto`
measures reduce-scatters and all-gathers per dtype and size class apart from allreduces, with the
same check-before-trust cache; every rank takes the same choice and the call follows it (the exact
inner collective, or the chosen quantized one, bit for bit the fixed configuration's); the cache
names each entry's collective (format 2) and a format-1 file still holds allreduce entries. The
timings are skewed on purpose (_testing.set_tune_timing_factors): this machine's decide nothing."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from tuning_env import MIB, factors_for, tune_env

import qcomm
from qcomm import _testing
from qcomm import reference as ref

from dist_util import run_ranks

RS, AG = 1, 2


def test_the_candidates_per_collective():
    cands = qcomm.tune_candidates
    assert cands(2, "reduce_scatter") == ["exact", "two_step/1", "two_step/4", "two_step/16"]
    assert cands(3, "reduce_scatter") == cands(2, "reduce_scatter")  # no ring RS in auto
    assert cands(2, "all_gather") == ["exact", "two_step/1", "two_step/4"]
    assert (
        cands(2, "reduce_scatter", True) == cands(2, "all_gather", True) == ["exact", "two_step/1"]
    )
    assert cands(2) == cands(2, "all_reduce", False) and "ring/4" in cands(2)  # the allreduce's
    with pytest.raises(ValueError, match="collective must be one of"):
        cands(2, "broadcast")


def _inputs(world, numel):
    return [
        torch.randn(numel, generator=torch.Generator().manual_seed(40 + r)) for r in range(world)
    ]


def _rs_worker(rank, world, favour):
    _testing.set_tune_timing_factors(qcomm.backend_of(), factors_for(favour, world, RS))
    xs = _inputs(world, world * (MIB // 8))  # 1 MiB of fp32 input: class 2^20
    outs = []
    for _ in range(2):  # the second call: the class is in the table
        out = torch.empty(MIB // 8)
        dist.reduce_scatter_tensor(out, xs[rank].clone())
        outs.append(out.numpy())
    rs_plan = qcomm.plan(xs[rank], collective="reduce_scatter")
    return outs, qcomm.tuning(), qcomm.stats(), rs_plan, qcomm.backend_of().tuning_cache()


def _rs_config():
    return qcomm.QuantConfig(reduce_scatter=True, min_bytes=0, tune=True)


def test_reduce_scatter_follows_the_tuned_choice_and_leaves_the_allreduce_alone(tmp_path):
    env = tune_env(tmp_path)
    xs = _inputs(2, 2 * (MIB // 8))
    for favour in ("two_step/16", "exact"):
        out = run_ranks(_rs_worker, 2, favour, pg_options=_rs_config(), env=env)
        if favour == "exact":
            want = [(xs[0] + xs[1])[r * (MIB // 8) : (r + 1) * (MIB // 8)] for r in range(2)]
        else:
            want = [w.out for w in ref.reduce_scatter(xs, "two_step", 8)]
        for rank, (outs, table, stats, plan, _) in enumerate(out):
            # one entry, the reduce-scatter's: no allreduce was measured
            assert [(e["collective"], e["size_class"], e["choice"]) for e in table] == [
                ("reduce_scatter", 20, favour)
            ], table
            assert all(torch.equal(torch.from_numpy(o), want[rank]) for o in outs), favour
            by = stats["by_collective"]["reduce_scatter"]
            assert by["quantized_calls"] == (0 if favour == "exact" else 2)
            assert by["passthrough_calls"] == (2 if favour == "exact" else 0)
            assert stats["tuned_classes"] == 1
            assert plan["quantize"] == (favour != "exact")
            if favour == "exact":
                assert plan["reason"] == "tuned: the exact reduce_scatter measured faster here"
        # rank 0 wrote the cache: format 2, the entry named by its collective
        doc = json.load(open(env["QCOMM_TUNE_FILE"]))
        assert doc["format"] == 2 and [e["collective"] for e in doc["entries"]] == [
            "reduce_scatter"
        ]
        (tmp_path / "tune.json").unlink()


def _cache_worker(rank, world):
    # exact 1000x faster: the choice, and the cached entries' check, are decided (no noise)
    _testing.set_tune_timing_factors(qcomm.backend_of(), factors_for("exact", world))
    x = torch.randn(MIB // 4)
    dist.all_reduce(x)
    shard = torch.randn(MIB // 8)
    out = torch.empty(world * (MIB // 8))
    dist.all_gather_into_tensor(out, shard)
    s = qcomm.stats()
    return qcomm.tuning(), s["tuned_classes"], s["checked_classes"]


def test_the_cache_holds_each_collective_and_a_format_1_file_stays_an_allreduce_table(tmp_path):
    env = tune_env(tmp_path)
    cfg = qcomm.QuantConfig(all_gather=True, tune=True)
    first = run_ranks(_cache_worker, 2, pg_options=cfg, env=env)
    table, measured, _ = first[0]
    assert measured == 2 and first[1][0] == table
    assert sorted((e["collective"], e["size_class"]) for e in table) == [
        ("all_gather", 20),
        ("all_reduce", 20),
    ]
    doc = json.load(open(env["QCOMM_TUNE_FILE"]))
    assert sorted(e["collective"] for e in doc["entries"]) == ["all_gather", "all_reduce"]
    # loaded, checked before trusted, not measured again
    for table2, measured, checked in run_ranks(_cache_worker, 2, pg_options=cfg, env=env):
        assert measured == 0 and checked == 2
        assert [(e["collective"], e["choice"]) for e in table2] == [
            (e["collective"], e["choice"]) for e in table
        ]
    # a format-1 file (before the collectives were tuned) holds allreduce entries: still used
    ar = [e for e in doc["entries"] if e["collective"] == "all_reduce"]
    for e in ar:
        del e["collective"]
    json.dump({"format": 1, "key": doc["key"], "entries": ar}, open(env["QCOMM_TUNE_FILE"], "w"))
    for table3, measured, checked in run_ranks(_cache_worker, 2, pg_options=cfg, env=env):
        assert measured == 1 and checked == 1  # the all-gather's class is new, the allreduce's not
        got = {(e["collective"], e["size_class"]): e["choice"] for e in table3}
        assert (
            got[("all_reduce", 20)]
            == [e["choice"] for e in table if e["collective"] == "all_reduce"][0]
        )


def _tune_call_worker(rank, world):
    table = qcomm.tune(
        sizes=[MIB, 2 * MIB], collectives=("reduce_scatter", "all_gather", "all_reduce")
    )
    try:
        qcomm.tune(sizes=[MIB], collectives=("broadcast",))
        refused = ""
    except ValueError as e:
        refused = str(e)
    return table, qcomm.stats()["tuned_classes"], refused


def test_qcomm_tune_names_the_collectives():
    cfg = qcomm.QuantConfig(tune=False, reduce_scatter=True, all_gather=False)
    (t0, c0, refused), (t1, c1, _) = run_ranks(_tune_call_worker, 2, pg_options=cfg)
    # all_gather is off in the config: not measured
    assert c0 == c1 == 4 and [e["choice"] for e in t0] == [e["choice"] for e in t1]
    assert sorted((e["collective"], e["size_class"]) for e in t0) == [
        ("all_reduce", 20),
        ("all_reduce", 21),
        ("reduce_scatter", 20),
        ("reduce_scatter", 21),
    ]
    rs = qcomm.tune_candidates(2, "reduce_scatter")
    assert all(set(e["seconds"]) == set(rs) for e in t0 if e["collective"] == "reduce_scatter")
    assert "collectives are all_reduce, reduce_scatter, all_gather" in refused


def test_the_command_line_names_the_collectives(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env.update(PYTHONPATH=root, **tune_env(tmp_path))
    cmd = [sys.executable, "-m", "qcomm.tune", "--world", "2", "--min-size", "1M"]
    cmd += ["--max-size", "1M", "--collective", "reduce_scatter"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "reduce_scatter" in r.stdout and "two_step/16" in r.stdout, r.stdout
    doc = json.load(open(tmp_path / "tune.json"))
    # the group's config did not quantize reduce-scatters: the command line turned them on
    assert [(e["collective"], e["size_class"]) for e in doc["entries"]] == [("reduce_scatter", 20)]
