"""The tests' names for qcomm.spawn: run_ranks (W spawned CPU ranks, exit codes checked) and
file_barrier (a barrier between process groups, through files)."""

from qcomm.spawn import file_barrier, run_ranks  # noqa: F401
