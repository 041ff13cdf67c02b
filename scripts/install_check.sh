#!/usr/bin/env bash
# The install path, checked end to end: a fresh venv with torch 2.11.0, `pip install
# --no-build-isolation .` of a clean copy of this tree (the wheel pip builds is the wheel a user
# gets), then, in that venv and outside the tree, a program that never imports qcomm creates a
# qnccl group through torch's backend autoload (qcomm_autoload.py) and runs a quantized allreduce
# on 2 spawned ranks. About 5 minutes on 2 cores with the CPU-only build (the default here;
# QCOMM_CUDA=1 for the CUDA build). Not part of scripts/test.sh (its time).
#   bash scripts/install_check.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${QCOMM_INSTALL_DIR:-/tmp/qcomm-install}"
PY="${QCOMM_PYTHON:-python3}"
say() { echo "[install] $*" >&2; }
rm -rf "$WORK"
mkdir -p "$WORK/src"
(cd "$ROOT" && git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$WORK/src")
say "venv $WORK/venv with torch 2.11.0"
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q --retries 10 torch==2.11.0 numpy setuptools wheel ninja
say "pip install --no-build-isolation (QCOMM_CUDA=${QCOMM_CUDA:-0})"
(cd "$WORK/src" && QCOMM_CUDA="${QCOMM_CUDA:-0}" MAX_JOBS="${MAX_JOBS:-2}" \
  "$WORK/venv/bin/python" -m pip install -q --no-build-isolation .)
# the build's objects and staging stay out of the source tree (setup.py's QCOMM_BUILD_DIR)
if [ -e "$WORK/src/build" ]; then
  say "FAIL: the install built inside the source tree ($WORK/src/build)"
  exit 1
fi
cat >"$WORK/no_import.py" <<'EOF'
# An unmodified torch program: it never imports qcomm.
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank, world, init_file):
    dist.init_process_group("qnccl", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    x = torch.full((1 << 19,), float(rank + 1))  # 2 MiB: quantized by default
    dist.all_reduce(x)
    import qcomm  # only to read what happened

    s = qcomm.stats()
    assert s["quantized_calls"] == 1, s
    assert abs(float(x[0]) - 3.0) < 0.05, float(x[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    assert "qcomm" not in sys.modules
    import qcomm_autoload  # noqa: F401 (already imported by torch's autoload)

    assert hasattr(dist.Backend, "QNCCL"), "torch's autoload did not register qnccl"
    assert "qcomm" not in sys.modules, "the autoload hook imported qcomm eagerly"
    init = os.path.join(tempfile.mkdtemp(), "store")
    mp.spawn(rank_main, args=(2, init), nprocs=2, join=True)
    print("autoload ok: a qnccl group without `import qcomm`, one quantized allreduce")
EOF
say "a program that never imports qcomm"
(cd "$WORK" && "$WORK/venv/bin/python" no_import.py)
cd "$WORK" && "$WORK/venv/bin/python" -c "import qcomm, os; print('[install] qcomm',
      qcomm.__version__, 'from', os.path.dirname(qcomm.__file__), '; py.typed:',
      os.path.exists(os.path.join(os.path.dirname(qcomm.__file__), 'py.typed')))"
say "ok"
