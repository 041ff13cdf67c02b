"""Where a benchmark ran, for the header of its results."""

from __future__ import annotations

import os
import platform


def cpu_model() -> str:
    """This machine's CPU model name."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def system_lines() -> list:
    """'# machine: ...' and '# torch ...' lines describing where a benchmark ran."""
    import torch

    import qcomm

    logical = os.cpu_count() or 0
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = logical
    return [
        f"# machine: {cpu_model()}, {logical} logical cores ({usable} usable), "
        f"{platform.system()} {platform.release()} {platform.machine()}",
        f"# torch {torch.__version__}, python {platform.python_version()}, "
        f"qcomm CUDA kernels compiled: {qcomm.compiled_with_cuda()}",
    ]


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, '0.52 0.61 0.70' (a shared machine's load)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
