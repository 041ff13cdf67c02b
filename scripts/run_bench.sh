#!/usr/bin/env bash
# Run the qnccl allreduce benchmark, the main job (benchmarks/allreduce_bench.py), on CPU ranks. It
# first runs scripts/setup.sh, which sets up .venv (torch 2.11.0) and builds the extension on a
# fresh machine and is quick when that is done. Every argument goes to allreduce_bench.py; see
# --help. Examples:
#   bash scripts/run_bench.sh                                  # defaults: 2 ranks, 1M,16M,64M fp32
#   bash scripts/run_bench.sh --world 3 --dtype bf16 --sizes 1M,4M --iters 3 --csv bench.csv
# The table goes to stdout, progress (and setup's log) to stderr; the exit status is non-zero when
# setup fails, a rank fails, or some output was not bit-identical across ranks.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# setup.sh prints the venv's python on stdout (the table owns stdout here) and logs to stderr
bash "$ROOT/scripts/setup.sh" >/dev/null
# stay in the caller's directory, so a relative --csv path lands where the caller expects
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$ROOT/.venv/bin/python" "$ROOT/benchmarks/allreduce_bench.py" "$@"
