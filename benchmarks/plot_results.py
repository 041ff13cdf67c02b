"""The headline plot of benchmarks/RESULTS.md: qnccl's allreduce against Gloo fp32 and Gloo bf16,
2 ranks at 1 Gbit/s, 64 MiB fp32, per algorithm and bits, from the first table of RESULTS.md
(its `vs_fp32` and `vs_bf16` columns: Gloo's time over qnccl's in the same run). It measures
nothing: it draws what the table holds.

    .venv/bin/python benchmarks/plot_results.py     # writes benchmarks/data/headline_1gbit.png
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "RESULTS.md")
OUT = os.path.join(HERE, "data", "headline_1gbit.png")
TITLE = "## CPU allreduce, 2 ranks, 1 Gbit/s, 64 MiB fp32"


def headline_rows(text: str) -> list:
    """(algorithm, bits, vs_fp32, vs_bf16) of the quantized rows of the table under TITLE."""
    start = text.index(TITLE)
    lines = text[start:].split("\n")
    head = None
    rows = []
    for line in lines[1:]:
        if line.startswith("## "):
            break
        if not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if head is None:
            head = cells
            continue
        row = dict(zip(head, cells))
        if row.get("vs_fp32"):
            rows.append(
                (row["what"], row["bits"], float(row["vs_fp32"][:-1]), float(row["vs_bf16"][:-1]))
            )
    if not rows:
        raise SystemExit(f"plot_results: no quantized rows under {TITLE!r} in {RESULTS}")
    return rows


def main() -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(RESULTS, encoding="utf-8") as f:
        rows = headline_rows(f.read())
    labels = [f"{a}\n{b}" for a, b, _, _ in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar([x - 0.2 for x in xs], [r[2] for r in rows], width=0.4, label="over Gloo fp32")
    ax.bar([x + 0.2 for x in xs], [r[3] for r in rows], width=0.4, label="over Gloo bf16")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("speed-up (Gloo's time / qnccl's)")
    ax.set_title("qnccl allreduce, 2 CPU ranks, 1 Gbit/s, 64 MiB fp32 (dev VM)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT, dpi=100)
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
