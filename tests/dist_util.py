"""The tests' name for qcomm.spawn.run_ranks (W spawned CPU ranks, exit codes checked)."""

from qcomm.spawn import run_ranks  # noqa: F401
