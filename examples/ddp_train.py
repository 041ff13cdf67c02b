"""DistributedDataParallel training with quantized gradient allreduce, against exact Gloo.

A small MLP learns a fixed random "teacher" MLP (a deterministic synthetic regression task, MSE
loss) on 2 CPU ranks, each on its half of every global batch. The same seed, data and schedule
run once over plain ``backend="gloo"`` (exact) and once per qnccl config, whose DDP gradient
allreduces (one bucket per step) are quantized with ``min_bytes=0``. The script prints the final
held-out losses, checks that every rank ends with the same parameters, and writes the loss curves
side by side to ``OUT/ddp_loss.png``::

    python examples/ddp_train.py --out /tmp/ddp            # exact, int8, int6 (4/8), int4
    python examples/ddp_train.py --out /tmp/ddp --steps 200 --seeds 0,1,2

``--seeds`` also repeats the exact run with other data-order seeds, which measures how much the
final loss moves from run to run anyway: the yardstick for the quantized runs' differences.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DIM_IN, DIM_HIDDEN, TEACHER_HIDDEN = 32, 256, 64
N_TRAIN, N_EVAL = 8192, 2048

#: name -> (backend, QuantConfig fields or None)
RUNS = {
    "exact (gloo)": ("gloo", None),
    "int8 (8/8)": ("qnccl", dict(rs_bits=8, ag_bits=8)),
    "int6 (4/8)": ("qnccl", dict(rs_bits=4, ag_bits=8)),
    "int4 (4/4)": ("qnccl", dict(rs_bits=4, ag_bits=4)),
    "int4 stochastic (4/4)": ("qnccl", dict(rs_bits=4, ag_bits=4, stochastic_rounding=True)),
}


def make_data(seed: int = 0):
    """Inputs ~ N(0, 1); targets from a fixed random tanh teacher, scaled to unit variance, plus
    noise of variance 1e-3 (the floor of the achievable MSE). Identical on every rank."""
    g = torch.Generator().manual_seed(1000 + seed)
    w1 = torch.randn(DIM_IN, TEACHER_HIDDEN, generator=g) / DIM_IN**0.5
    w2 = torch.randn(TEACHER_HIDDEN, 1, generator=g) / TEACHER_HIDDEN**0.5
    x = torch.randn(N_TRAIN + N_EVAL, DIM_IN, generator=g)
    y = torch.tanh(x @ w1) @ w2
    y = y / y.std()
    y = y + 0.03 * torch.randn(y.shape, generator=g)
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:], y[N_TRAIN:]


def make_model():
    torch.manual_seed(0)  # DDP broadcasts rank 0's parameters anyway
    return torch.nn.Sequential(
        torch.nn.Linear(DIM_IN, DIM_HIDDEN),
        torch.nn.GELU(),
        torch.nn.Linear(DIM_HIDDEN, DIM_HIDDEN),
        torch.nn.GELU(),
        torch.nn.Linear(DIM_HIDDEN, 1),
    )


def train(rank, world, steps=300, batch=256, lr=3e-3, eval_every=10, seed=0, feedback_bits=None):
    """Train on the initialized default process group (gloo or qnccl). Returns the held-out loss
    curve [(step, loss)], the final held-out loss, a digest of the final parameters and the
    default group's qcomm stats (None on gloo). feedback_bits: average the gradients with
    qcomm.feedback's DDP hook instead (its own qnccl group, reduce and gather phases at that many
    bits, their errors fed back); "feedback" in the result then holds that group's stats."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import qcomm

    x, y, xe, ye = make_data()
    model = DDP(make_model())
    state = None
    if feedback_bits is not None:
        import qcomm.feedback

        state = qcomm.feedback.DDPErrorFeedback(bits=feedback_bits)
        model.register_comm_hook(state, qcomm.feedback.ddp_hook)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    order = torch.Generator().manual_seed(seed)
    per_rank = batch // world
    curve = []

    def evaluate():
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model.module(xe), ye))

    is_qnccl = dist.get_backend() == qcomm.BACKEND
    if is_qnccl:
        qcomm.reset_stats()
    for step in range(steps):
        if step % eval_every == 0:
            curve.append((step, evaluate()))
        idx = torch.randint(0, N_TRAIN, (batch,), generator=order)  # same global batch everywhere
        mine = idx[rank * per_rank : (rank + 1) * per_rank]
        loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine])
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP averages the gradients: one bucket allreduce on the group
        opt.step()
        sched.step()
    final = evaluate()
    curve.append((steps, final))
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    stats = qcomm.stats() if is_qnccl else None
    fed = None if state is None else dict(qcomm.stats(state.group), error_bytes=state.nbytes())
    return {"curve": curve, "final": final, "digest": digest, "stats": stats, "feedback": fed}


def _train_entry(rank, world, kwargs):
    return train(rank, world, **kwargs)


def launch(backend, cfg, world=2, timeout=600, **kwargs):
    """Spawn `world` ranks running train(); return their results by rank."""
    import qcomm
    from qcomm.spawn import run_ranks

    pg_options = qcomm.QuantConfig(min_bytes=0, **cfg) if cfg is not None else None
    return run_ranks(
        _train_entry, world, kwargs, backend=backend, pg_options=pg_options, timeout=timeout
    )


def plot(curves: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, axd) = plt.subplots(1, 2, figsize=(12, 4.5))
    ref = dict(curves["exact (gloo)"])
    colors = dict(zip(curves, plt.get_cmap("tab10").colors))
    for name, curve in curves.items():
        steps, losses = zip(*curve)
        seed_run = "seed" in name
        style = dict(color=colors[name], lw=1.0, ls=":" if seed_run else "-")
        ax.plot(steps, losses, label=name, **style)
        if name != "exact (gloo)":
            rel = [100 * (loss / ref[s] - 1) for s, loss in curve]
            axd.plot(steps, rel, label=name, **style)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("held-out MSE")
    ax.set_title("DDP, 2 ranks: quantized gradient allreduce vs exact Gloo")
    ax.legend()
    axd.axhline(0, color="k", lw=0.5)
    axd.set_xlabel("step")
    axd.set_ylabel("held-out MSE vs exact, %")
    axd.set_title("relative difference to exact (seed 0)")
    axd.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="folder for ddp_loss.png")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--seeds", default="0", help="data-order seeds of extra exact runs, e.g. 0,1,2")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    curves, finals = {}, {}
    for name, (backend, cfg) in RUNS.items():
        t0 = time.perf_counter()
        res = launch(backend, cfg, world=args.world, steps=args.steps)
        same = len({r["digest"] for r in res}) == 1
        curves[name], finals[name] = res[0]["curve"], res[0]["final"]
        st = res[0]["stats"]
        extra = f", quantized allreduces {st['quantized_calls']}" if st else ""
        print(
            f"{name:14s} final held-out MSE {res[0]['final']:.5f} "
            f"(start {res[0]['curve'][0][1]:.4f})"
            f"{extra}; parameters identical across ranks: {same}; "
            f"{time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        if not same:
            raise SystemExit("ranks disagree on the parameters")
    for s in [int(v) for v in args.seeds.split(",") if v.strip()]:
        if s == 0:
            continue
        res = launch("gloo", None, world=args.world, steps=args.steps, seed=s)
        curves[f"exact, seed {s}"] = res[0]["curve"]
        finals[f"exact, seed {s}"] = res[0]["final"]
        print(f"exact, seed {s:<4d} final held-out MSE {res[0]['final']:.5f}", flush=True)
    ex = finals["exact (gloo)"]
    for name, f in finals.items():
        print(f"  {name:14s} {f:.5f}  ({100 * (f / ex - 1):+.2f}% vs exact)")
    path = os.path.join(args.out, "ddp_loss.png")
    plot(curves, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
