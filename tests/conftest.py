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
