"""What `auto`'s tuner trusts and when (csrc/backend/tuner.cpp, qcomm/_tuning.py): the cache's key
holds the network path Gloo connected over; an entry loaded from the cache is checked at the first
call of its class and replaced when the check disagrees; a class whose real calls drift from what
tuning measured is re-tuned on every rank at the same call; and the defects adversarial use found
in the same parts (issue 39, section 3): call numbers that depended on when a rank read the table,
a future callback waiting on a later call, stats() blocking on a running call, corrupt or odd cache
files, and the command line's second run. Timings are injected (_testing.set_tune_timing_factors,
_testing.set_call_timing_factor) where a test needs a given outcome."""

import datetime
import json
import os
import stat
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from tuning_env import CANDIDATES, MIB, factors_for, tune_env

import qcomm
from qcomm import _testing, _tuning

from dist_util import run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- the key holds the path --------------------------------------------------------------------


def _path_worker(rank, world, addr, init_file):
    store = dist.FileStore(init_file, world)
    opts = dist.ProcessGroupGloo._Options()
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=addr)]
    opts._timeout = datetime.timedelta(seconds=60)
    pg, mine = _tuning.connect_recording(lambda: dist.ProcessGroupGloo(store, rank, world, opts))
    paths = _tuning.agree_path(store, rank, world, mine)
    cfg = qcomm.QuantConfig()
    key = _tuning.cache_key(cfg, world, ["h", "h"], 1, qcomm.__version__, paths)
    del pg
    return key


def test_the_key_holds_the_network_path(tmp_path):
    def key(addr, n):
        out = run_ranks(_path_worker, 2, addr, str(tmp_path / f"store{n}"), backend=None)
        assert out[0] == out[1]  # every rank contributes, every rank holds the same key
        return out[0]

    a1, a2, b = key("127.0.0.1", 1), key("127.0.0.1", 2), key("127.0.0.2", 3)
    # what Gloo connected with, each rank's (local, peer) addresses, ports aside
    assert a1["path"][0] == {"connections": [["127.0.0.1", "127.0.0.1"]]}, a1["path"]
    # bound to 127.0.0.2: each rank's connection has it at one end (the connecting side's source
    # address is the kernel's choice, 127.0.0.1)
    for p in b["path"]:
        assert all("127.0.0.2" in pair for pair in p["connections"]), b["path"]
    assert a1 == a2  # the same path: the same key (and cache file)
    assert a1 != b and _tuning.cache_path(a1) != _tuning.cache_path(b)
    # a table written over one path is not trusted over the other
    path = str(tmp_path / "t.json")
    json.dump({"format": 1, "key": a1, "entries": []}, open(path, "w"))
    assert "differs in: path" in _tuning.read_cache(path, b)[1]


# ---- checked before trusted --------------------------------------------------------------------


def _check_worker(rank, world, favour):
    if favour:
        _testing.set_tune_timing_factors(qcomm.backend_of(), factors_for(favour, world))
    before = qcomm.tuning()
    x = torch.randn(MIB // 4)
    dist.all_reduce(x)
    return before, qcomm.tuning(), qcomm.stats()


def test_a_cached_entry_is_checked_and_replaced_when_it_disagrees(tmp_path):
    env = tune_env(tmp_path)
    first = run_ranks(_check_worker, 2, "ring/16", env=env)
    assert first[0][1][0]["choice"] == "ring/16" and first[0][2]["tuned_classes"] == 1
    # the fresh measurement agrees (ring/16 still far ahead of exact): the entry is kept, checked
    # once, nothing measured again
    for before, after, s in run_ranks(_check_worker, 2, "ring/16", env=env):
        assert [e["choice"] for e in before] == ["ring/16"] and not before[0]["verified"]
        assert after[0]["choice"] == "ring/16" and after[0]["verified"]
        assert s["checked_classes"] == 1 and s["tuned_classes"] == 0
        assert s["retuned_classes"] == 0 and s["check_seconds"] > 0
    # it disagrees (exact is now 1000x faster): the class is measured again, on every rank, and
    # rank 0 rewrites the entry
    out = run_ranks(_check_worker, 2, "exact", env=env)
    for before, after, s in out:
        assert before[0]["choice"] == "ring/16"
        assert after[0]["choice"] == "exact" and after[0]["verified"]
        assert s["checked_classes"] == 0 and s["tuned_classes"] == 1 and s["retuned_classes"] == 1
    doc = json.load(open(env["QCOMM_TUNE_FILE"]))
    assert [(e["algorithm"], e["size_class"]) for e in doc["entries"]] == [("none", 20)]


# ---- revised when real calls disagree -----------------------------------------------------------


def _drift_worker(rank, world, calls):
    if rank == 0:  # only rank 0's real calls look 1000x slower than tuning measured
        _testing.set_call_timing_factor(qcomm.backend_of(), 1000.0)
    x = torch.randn(16384)
    seen = []
    for _ in range(calls):
        dist.all_reduce(x)
        seen.append(qcomm.stats()["tuned_classes"])
    return seen, qcomm.stats()["retuned_classes"]


def test_a_drift_seen_by_one_rank_retunes_every_rank_at_the_same_call(tmp_path):
    (seen0, re0), (seen1, re1) = run_ranks(
        _drift_worker, 2, 40, env=tune_env(tmp_path, QCOMM_MIN_BYTES="0")
    )
    assert seen0 == seen1  # the same classes measured after every call, on both ranks
    assert seen0[0] == 1 and re0 == re1 == 1
    # the first comparison runs before the 33rd call of the class (kDriftFirst = 32): re-tuned
    # there; the next one is 64 calls later (the back-off), beyond this run
    assert seen0.index(2) == 32 and seen0[-1] == 2


# ---- section 3, defect 1: call numbers do not depend on when a rank read the table -------------


def _uneven_worker(rank, world):
    be = qcomm.backend_of()
    _testing.set_tune_timing_factors(be, factors_for("exact"))
    a, b = torch.randn(MIB // 4), torch.randn(MIB // 4)
    if rank == 0:
        dist.all_reduce(a)  # the class is measured (exact) before b is issued: b reads the table
        wb = dist.all_reduce(b, async_op=True)
    else:  # b is issued while a's class is still being measured
        wa = dist.all_reduce(a, async_op=True)
        wb = dist.all_reduce(b, async_op=True)
        wa.wait()
    wb.wait()
    seq = qcomm.stats()["next_call_seq"]
    # a call of every rank's shadow is decided by its number: they must agree before it runs
    qcomm.set_config(qcomm.get_config().replace(algorithm="two_step"))
    c = torch.ones(MIB)
    dist.all_reduce(c)
    return seq, c[0].item(), qcomm.stats()["shadow"]


def test_call_numbers_do_not_depend_on_when_a_rank_read_the_table(tmp_path):
    cfg = qcomm.QuantConfig(shadow=2, tune=True)
    (s0, c0, sh0), (s1, c1, sh1) = run_ranks(
        _uneven_worker, 2, pg_options=cfg, env=tune_env(tmp_path), timeout=120
    )
    assert s0 == s1 == 2  # a and b counted alike: b passed through on both ranks
    assert c0 == c1 == 2.0
    assert sh0.keys() == sh1.keys() and len(sh0) == 1  # the 4 MiB call shadowed on both


def test_the_host_header_carries_the_call_number():
    # the emulated header exchange (describe_mismatch over two plans of different call numbers)
    rng = _testing.header_mismatch(3, 4)
    assert "call number" in rng and "3 on rank 0 but 4 on rank 1" in rng
    assert _testing.header_mismatch(5, 5) == ""


# ---- defect 2: a future callback waiting on a later call of the same group ---------------------


def _callback_worker(rank, world):
    x1, x2 = torch.ones(MIB // 4), torch.ones(MIB // 4)
    # w1 waits for the group's buffers a second (as behind a slow call): its callback is attached
    # before it completes, so the callback runs on the progress thread
    _testing.hold_buffer_lock(qcomm.backend_of(), 1.0)
    w1 = dist.all_reduce(x1, async_op=True)
    w2 = dist.all_reduce(x2, async_op=True)
    start = time.monotonic()
    try:
        w1.get_future().then(lambda f: w2.wait()).wait()
        err = ""
    except Exception as e:  # noqa: BLE001 - what the callback's wait raised
        err = str(e)
    took = time.monotonic() - start
    w2.wait()
    y = torch.ones(1000)
    dist.all_reduce(y)  # the group is usable
    # waiting for the work itself in its own callback returns at once
    w3 = dist.all_reduce(torch.ones(MIB // 4), async_op=True)
    got = w3.get_future().then(lambda f: w3.wait()).wait()
    return err, took, x2[0].item(), y[0].item(), got


def test_a_callback_waiting_on_a_later_call_runs_it_inline():
    # the callback's w2.wait() runs w2 (queued behind the callback) inline, as Gloo completes it
    cfg = qcomm.QuantConfig(min_bytes=0, algorithm="two_step")
    for err, took, x2, y, got in run_ranks(_callback_worker, 2, pg_options=cfg, timeout=90):
        assert err == "", err
        assert took < 10
        assert x2 == 2.0 and y == 2.0 and got is True


# ---- defect 3: stats() does not wait for a running call ---------------------------------------


def _stats_worker(rank, world):
    be = qcomm.backend_of()
    x = torch.randn(MIB // 4)
    dist.all_reduce(x)
    held = be.stats()["buffer_bytes"]
    _testing.hold_buffer_lock(be, 3.0)  # as a call blocked on a stopped peer holds it
    start = time.monotonic()
    s = qcomm.stats()
    took = time.monotonic() - start
    # a child forked while the lock is held: its stats() must return too
    _testing.hold_buffer_lock(be, 3.0)
    pid = os.fork()
    if pid == 0:
        try:
            qcomm.stats()
            os._exit(0)
        except BaseException:  # noqa: BLE001
            os._exit(3)
    deadline = time.monotonic() + 2.5
    code = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.05)
    if code is None:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    time.sleep(3.2)  # the holds end before the group goes
    return took, s["buffer_bytes"] == held > 0, code


def test_stats_does_not_wait_for_a_running_call():
    cfg = qcomm.QuantConfig(min_bytes=0, algorithm="two_step")
    for took, same, code in run_ranks(_stats_worker, 2, pg_options=cfg, timeout=90):
        assert took < 1.0 and same
        assert code == 0  # the forked child's stats() returned


# ---- defect 4: corrupt cache files are ignored with a warning naming the file and field -------


CORRUPT = {
    "deep": lambda key: "[" * 100000 + "]" * 100000,
    "infinity": lambda key: json.dumps(
        {
            "format": 1,
            "key": key,
            "entries": [
                {
                    "dtype": "float32",
                    "size_class": 20,
                    "bytes": MIB,
                    "algorithm": "ring",
                    "microshards": 4,
                }
            ],
        }
    ).replace('"microshards": 4', '"microshards": Infinity'),
    "huge": lambda key: json.dumps(
        {
            "format": 1,
            "key": key,
            "entries": [
                {
                    "dtype": "float32",
                    "size_class": 20,
                    "bytes": 2**70,
                    "algorithm": "ring",
                    "microshards": 4,
                }
            ],
        }
    ),
}


def test_read_cache_names_the_field_of_a_corrupt_file(tmp_path):
    key = {"world": 2}
    path = str(tmp_path / "t.json")
    for name, why in (("deep", "nested too deeply"), ("infinity", "Infinity"), ("huge", "'bytes'")):
        open(path, "w").write(CORRUPT[name](key))
        entries, got = _tuning.read_cache(path, key)
        assert entries == [] and why in got, (name, got)
    entry = {"dtype": "float32", "size_class": 20, "bytes": MIB, "algorithm": "ring"}
    for bad, field in (({"microshards": 4.0}, "'microshards'"), ({"seconds": {"x": 1}}, "x")):
        json.dump(
            {"format": 1, "key": key, "entries": [{**entry, "microshards": 4, **bad}]},
            open(path, "w"),
        )
        assert field in _tuning.read_cache(path, key)[1]


def _key_worker(rank, world):
    x = torch.randn(MIB // 4)
    dist.all_reduce(x)
    return qcomm.stats()["tuned_classes"], qcomm.tuning()[0]["choice"]


@pytest.mark.parametrize("kind", sorted(CORRUPT))
def test_a_corrupt_cache_is_ignored_on_every_rank_at_once(tmp_path, kind, capfd):
    env = tune_env(tmp_path)
    run_ranks(_key_worker, 2, env=env)  # a valid table of this set-up
    key = json.load(open(env["QCOMM_TUNE_FILE"]))["key"]
    open(env["QCOMM_TUNE_FILE"], "w").write(CORRUPT[kind](key))
    capfd.readouterr()
    start = time.monotonic()
    for measured, choice in run_ranks(_key_worker, 2, env=env, timeout=90):
        assert measured == 1 and choice in CANDIDATES
    assert time.monotonic() - start < 60
    err = capfd.readouterr().err
    assert f"the tuning cache {env['QCOMM_TUNE_FILE']} is ignored" in err, err[-2000:]
    if kind == "huge":
        assert "field 'bytes'" in err


# ---- defect 5: QCOMM_TUNE_FILE that is not a regular file --------------------------------------


def _odd_file_cases(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = tmp_path / "target.json"
    target.write_text("keep me")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    cases = [(fifo, stat.S_ISFIFO), (link, stat.S_ISLNK)]
    if os.geteuid() == 0:  # a device node like /dev/null, made here (never the system's)
        dev = tmp_path / "null"
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        cases.append((dev, stat.S_ISCHR))
    return cases, target


def test_a_tune_file_that_is_not_a_regular_file_is_refused_and_left_alone(tmp_path, capfd):
    cases, target = _odd_file_cases(tmp_path)
    for path, kind in cases:
        env = tune_env(tmp_path, QCOMM_TUNE_FILE=str(path))
        start = time.monotonic()
        for measured, _ in run_ranks(_key_worker, 2, env=env, timeout=60):
            assert measured == 1  # measured, kept in memory
        assert time.monotonic() - start < 50
        assert kind(os.lstat(path).st_mode), path  # not replaced
        err = capfd.readouterr().err
        assert f"the tuning cache {path} is" in err and "not a regular file" in err, err[-2000:]
    assert target.read_text() == "keep me"


# ---- defect 6 and the command line: the key, the entries, a second run, dropping a cache ------


def _cli(tmp_path, *args):
    env = dict(os.environ, PYTHONPATH=ROOT, **tune_env(tmp_path))
    r = subprocess.run(
        [sys.executable, "-m", "qcomm.tune", "--world", "2", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=str(tmp_path),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def test_the_command_line_runs_twice_shows_the_key_and_drops_the_cache(tmp_path):
    cache = str(tmp_path / "tune.json")
    _cli(tmp_path, "--min-size", "1M", "--max-size", "1M")
    # a second run with another size and dtype: the first run's entries come from the cache
    out = _cli(tmp_path, "--min-size", "2M", "--max-size", "2M", "--dtypes", "bfloat16")
    assert "1 MiB" in out and "2 MiB" in out and "bfloat16" in out, out
    assert '"path": [' in out  # the key, with the network path
    shown = _cli(tmp_path, "--show")
    assert "key: {" in shown and f"cache: {cache}" in shown and "2 MiB" in shown, shown
    assert len(json.load(open(cache))["entries"]) == 2
    dropped = _cli(tmp_path, "--drop")
    assert f"removed {cache}" in dropped and not os.path.exists(cache)


# ---- CUDA tensors are not tuned ---------------------------------------------------------------


def _cuda_refused_worker(rank, world):
    try:
        qcomm.tune(sizes=[MIB], device="cuda")
        return ""
    except ValueError as e:
        return str(e)


def test_the_tuner_refuses_cuda_tensors(tmp_path):
    for err in run_ranks(_cuda_refused_worker, 2, env=tune_env(tmp_path)):
        assert "host-memory allreduces only" in err and "two_step" in err
