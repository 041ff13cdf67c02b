import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)


# The suite checks `auto` bit for bit as two_step: the tuner, which picks an algorithm from
# timings, is off unless a test turns it on (tests/backend/test_tuner.py). Spawned ranks inherit it.
os.environ.setdefault("QCOMM_TUNE", "0")
# torch 2.11's Flight Recorder (on by default, one per process) can spin forever when several
# Gloo groups of one process enqueue at once (pytorch/pytorch PR 179313): the in-process tests
# run every rank's group, and its progress thread, in one process, and a clean-clone run hung in
# tests/algo/test_wire_fixture.py on 2026-12-06 with a progress thread at 100% CPU inside
# FlightRecorder::recordWithResetEnabled. The suite records nothing with it: off.
os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "0")


def _with_experiments():
    """Whether the extension was built with QCOMM_EXPERIMENTS=1 (False when it cannot be
    imported: the other tests then say why)."""
    try:
        from qcomm import _C
    except ImportError:
        return False
    return bool(getattr(_C, "compiled_with_experiments", lambda: False)())


# tests/experiments tests what only a QCOMM_EXPERIMENTS=1 build has (csrc/experiments/README.md;
# bash scripts/experiments_check.sh): not collected from a default build
collect_ignore = [] if _with_experiments() else ["experiments"]


# The quick tier (`bash scripts/test.sh --quick`, docs/testing.md): every layer once, in at most 3
# minutes on the 2-core machine: the codec on every ISA, the plan and the settings, each schedule
# over the real transport at 2 ranks, the backend's entry points (pass-through, quantized, sharded,
# the faults of issue 50), the wire fixture, and the structure checks. A node id here marks the
# tests whose id starts with it `quick`; everything else runs in the default tier only.
QUICK = (
    "tests/codec/",
    "tests/plan/",
    "tests/structure/",
    "tests/algo/test_wire_fixture.py",
    "tests/algo/test_allreduce.py::test_matrix[2]",
    "tests/algo/test_allreduce.py::test_nonfinite_stays_nonfinite",
    "tests/algo/test_collective_algos.py::test_matches_cpu_path_and_reference[2]",
    "tests/algo/test_sharded.py",
    "tests/backend/test_one_plan.py",
    "tests/backend/test_passthrough.py",
    "tests/backend/test_sharded_backend.py",
    "tests/backend/test_bad_tensors.py",
    "tests/backend/test_kill_switch.py",
    "tests/backend/test_async.py::test_work_future_and_callbacks",
    "tests/backend/test_reliability.py::test_mismatch_across_ranks_is_named_on_every_rank",
    "tests/backend/test_faults.py::test_a_callback_waiting_for_a_later_collective_completes",
    "tests/backend/test_faults.py::test_set_config_that_differs_across_ranks_raises",
    "tests/backend/test_tuner.py::test_a_tuned_plan_gives_the_bits_of_the_same_fixed_config",
    "tests/transport/test_ipc_exchange.py::"
    "test_ipc_separate_kernels_emulated_match_the_reference[2]",
    "tests/backend/test_coalesced.py::test_list_forms_with_several_tensors_quantize",
    "tests/integration/test_feedback.py::test_reduce_error_is_what_two_steps_reduce_phase",
    "tests/integration/test_delta.py::test_a_changed_buffer_or_a_restarted_rank_falls_back",
)


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if item.nodeid.startswith(QUICK):
            item.add_marker(pytest.mark.quick)
