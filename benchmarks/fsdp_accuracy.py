"""FSDP2 training accuracy with quantized reduce-scatters and all-gathers: a character-level
language model trained a few hundred steps, its final held-out loss against the exact run's and
against the spread of exact runs across seeds.

The model and data are examples/diloco.py's: CharMLP (a 32-character context, about 5.3 M
parameters) on the State of the Union addresses from 2001 on (../shared/data/sotu), the last 5%
held out. Each Linear and the model are fully_shard'ed on a 1-D mesh of every rank (fp32), AdamW
with a cosine schedule, a global batch of --batch split over the ranks. Runs, all on the same
data order and initial weights for a given seed:

  exact s0, s1, s2   FSDP2 on Gloo, seeds 0, 1, 2 (the spread a quantized run is judged against)
  rs8                qnccl, gradients reduce-scattered at 8 bits (seed 0)
  rs4                qnccl, gradients at 4 bits, rotation as QuantConfig's default (seed 0)
  rs8_ag8            qnccl, gradients and parameter all-gathers at 8 bits (seed 0)

Rank 0 prints each run's final held-out cross-entropy, its difference from exact s0 and the
exact seeds' spread (max - min, relative to their mean), and how many calls were quantized.

    .venv/bin/python benchmarks/fsdp_accuracy.py --ranks 2 --steps 300
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import qbench
import torch

sys.path.insert(0, os.path.join(qbench.ROOT, "examples"))

import diloco  # noqa: E402  (the model, the text and its batches)

QUANTIZED = {
    "rs8": dict(reduce_scatter=True),
    "rs4": dict(reduce_scatter=True, rs_bits=4),
    "rs8_ag8": dict(reduce_scatter=True, all_gather=True),
}


def train(rank: int, world: int, steps: int, seed: int, batch: int, lr: float) -> dict:
    """One run on the default group (gloo or qnccl, already initialised); returns the final
    held-out loss and, on qnccl, the counters of quantized calls."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import qcomm

    train_ids, held_ids, vocab = diloco.load_text()
    torch.manual_seed(seed)  # the same initial weights on every rank
    model = diloco.CharMLP(vocab)
    mesh = init_device_mesh("cpu", (world,))
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    order = torch.Generator().manual_seed(1000 + seed)  # the global batches, alike on every rank
    held = diloco.batch(held_ids, model.ctx, 4096, torch.Generator().manual_seed(7))
    per_rank = batch // world
    for _ in range(steps):
        x, y = diloco.batch(train_ids, model.ctx, batch, order)
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        loss = torch.nn.functional.cross_entropy(model(x[mine]), y[mine])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        final = float(torch.nn.functional.cross_entropy(model(held[0]), held[1]))
    out = {"final": final}
    if dist.get_backend() == "qnccl":
        by = qcomm.stats()["by_collective"]
        out["rs_q"] = by["reduce_scatter"]["quantized_calls"]
        out["ag_q"] = by["all_gather"]["quantized_calls"]
    return out


def main() -> int:
    import qcomm

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64, help="global batch (split over the ranks)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seeds", type=int, default=3, help="exact runs, seeds 0..N-1")
    ap.add_argument("--runs", default=",".join(QUANTIZED), help="quantized runs, comma separated")
    a = ap.parse_args()
    if a.batch % a.ranks:
        ap.error("--batch must be a multiple of --ranks")
    args = (a.steps, 0, a.batch, a.lr)
    results = {}
    for seed in range(a.seeds):
        t0 = time.perf_counter()
        r = qbench.run_ranks(
            train, a.ranks, a.steps, seed, a.batch, a.lr, backend="gloo", timeout=3600
        )
        results[f"exact s{seed}"] = (r[0], time.perf_counter() - t0)
        print(f"exact s{seed}: {r[0]['final']:.4f}", flush=True)
    for name in a.runs.split(","):
        cfg = qcomm.QuantConfig(min_bytes=0, tune=False, **QUANTIZED[name])
        t0 = time.perf_counter()
        r = qbench.run_ranks(train, a.ranks, *args, pg_options=cfg, timeout=3600)
        results[name] = (r[0], time.perf_counter() - t0)
        print(f"{name}: {r[0]['final']:.4f}", flush=True)
    exact = [results[f"exact s{s}"][0]["final"] for s in range(a.seeds)]
    base = exact[0]
    mean = sum(exact) / len(exact)
    print(
        f"# FSDP2, CharMLP on sotu, {a.ranks} ranks, {a.steps} steps, global batch {a.batch}, "
        f"lr {a.lr}; exact spread across {a.seeds} seeds: {(max(exact) - min(exact)) / mean:.2%} "
        f"(min {min(exact):.4f}, max {max(exact):.4f})"
    )
    head = ["run", "final held-out loss", "vs exact s0", "RS quantized", "AG quantized", "wall s"]
    rows = []
    for name, (r, wall) in results.items():
        assert math.isfinite(r["final"]), (name, r)
        rows.append(
            [name, f"{r['final']:.4f}", f"{r['final'] / base - 1:+.2%}", r.get("rs_q", "")]
            + [r.get("ag_q", ""), f"{wall:.0f}"]
        )
    print(qbench.md_table(head, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
