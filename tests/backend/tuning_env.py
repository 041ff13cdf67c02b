"""What the tuner's tests (test_tuner.py, test_tuner_trust.py) share: the environment of a group
that tunes into a cache file of its own, and timing factors that make one candidate win."""

import qcomm

CANDIDATES = qcomm.tune_candidates(2)
MIB = 1 << 20


def tune_env(tmp_path, **extra):
    """Environment variables for ranks that tune, with their cache in tmp_path."""
    env = {"QCOMM_TUNE": "1", "QCOMM_TUNE_FILE": str(tmp_path / "tune.json")}
    env.update(extra)
    return env


def factors_for(name, world=2, collective=0):
    """Timing factors that make candidate `name` of `collective` (0 allreduce, 1 reduce-scatter,
    2 all-gather) look 1000x faster than every other."""
    cands = qcomm.tune_candidates(world, ("all_reduce", "reduce_scatter", "all_gather")[collective])
    return [0.001 if c == name else 1.0 for c in cands]
