"""DiLoCo-style training over a slow link, its outer allreduce quantized and overlapped.

Each rank trains its own copy of a small character-level language model (the State of the Union
addresses from 2001 on, ../shared/data/sotu; a 32-character context, an MLP of about 5.3 M
parameters) for H inner AdamW steps on its own batches; then the ranks average their
pseudo-gradients (how far each moved from the shared model) with one allreduce, and an outer
Nesterov SGD step (lr 0.7, momentum 0.9, as in DiLoCo) moves the shared model.

Runs, same seeds and data:
  exact:        Gloo fp32, the outer allreduce waited for at once (plain DiLoCo);
  int8, int4:   qnccl 8/8 and 4/4, waited for at once (what quantizing costs, alone);
  exact overlap: Gloo fp32, the allreduce overlapping the next H inner steps;
  int8 overlap, int4 overlap: qnccl 8/8 and 4/4, overlapping the same way.

Overlapping, as in Streaming DiLoCo with a delay of one round: the pseudo-gradient of round t
travels while round t+1 computes; at the end of round t+1 the shared model takes the outer step of
round t, and the local copy becomes the shared model plus this rank's own progress of round t+1.
The loss reported is the shared model's on held-out text (identical on every rank).

    python examples/diloco.py --out /tmp/diloco                 # loopback, 2 ranks
    sudo .venv/bin/python examples/diloco.py --out /tmp/diloco --rate 1gbit   # emulated link

It prints each run's final held-out loss and wall time, writes OUT/diloco_loss.png (loss curves
side by side) and OUT/diloco.csv.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
DATA = os.path.join(os.path.dirname(ROOT), "shared", "data", "sotu")

#: name -> (backend, QuantConfig fields or None, overlap)
RUNS = {
    "exact": ("gloo", None, False),
    "int8": ("qnccl", dict(rs_bits=8, ag_bits=8), False),
    "int4": ("qnccl", dict(rs_bits=4, ag_bits=4), False),
    "exact overlap": ("gloo", None, True),
    "int8 overlap": ("qnccl", dict(rs_bits=8, ag_bits=8), True),
    "int4 overlap": ("qnccl", dict(rs_bits=4, ag_bits=4), True),
}


def load_text(data_dir: str = DATA):
    """The speeches from 2001 on, concatenated in file order; returns (train ids, held-out ids,
    vocabulary size). The last 5% is held out."""
    files = sorted(
        f
        for f in glob.glob(os.path.join(data_dir, "*.txt"))
        if int(os.path.basename(f)[:4]) >= 2001
    )
    if not files:
        raise SystemExit(f"no speeches from 2001 on under {data_dir}")
    text = "\n".join(open(f, encoding="utf-8").read() for f in files)
    vocab = sorted(set(text))
    table = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([table[c] for c in text], dtype=torch.long)
    cut = int(len(ids) * 0.95)
    return ids[:cut], ids[cut:], len(vocab)


class CharMLP(torch.nn.Module):
    """Embeds a context of `ctx` characters and predicts the next one."""

    def __init__(self, vocab: int, ctx: int = 32, dim: int = 128, hidden: int = 1024):
        super().__init__()
        self.ctx = ctx
        self.emb = torch.nn.Embedding(vocab, dim)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(ctx * dim, hidden),
            torch.nn.GELU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.GELU(),
            torch.nn.Linear(hidden, vocab),
        )

    def forward(self, x):
        return self.net(self.emb(x).flatten(1))


def batch(ids, ctx: int, size: int, g: torch.Generator):
    at = torch.randint(0, len(ids) - ctx - 1, (size,), generator=g)
    x = torch.stack([ids[i : i + ctx] for i in at.tolist()])
    y = ids[at + ctx]
    return x, y


def train(rank: int, world: int, args, backend: str, cfg, overlap: bool, init_method: str):
    """One run on this rank; returns (held-out loss per round, wall seconds, parameter count)."""
    import torch.distributed as dist

    import qcomm

    torch.set_num_threads(1)
    train_ids, eval_ids, vocab = load_text(args.data)
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world,
        pg_options=qcomm.QuantConfig(**cfg) if cfg else None,
    )
    torch.manual_seed(args.seed)
    model = CharMLP(vocab)
    params = list(model.parameters())
    shared = [p.detach().clone() for p in params]  # the shared model, identical on every rank
    flat = torch.empty(sum(p.numel() for p in params))
    outer = torch.optim.SGD(shared, lr=0.7, momentum=0.9, nesterov=True)
    inner = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(args.seed * 100 + rank)
    eg = torch.Generator().manual_seed(12345)
    evals = [batch(eval_ids, model.ctx, 256, eg) for _ in range(8)]

    def held_out():
        with torch.no_grad():
            saved = [p.detach().clone() for p in params]
            for p, s in zip(params, shared):
                p.copy_(s)
            loss = sum(torch.nn.functional.cross_entropy(model(x), y).item() for x, y in evals)
            for p, s in zip(params, saved):
                p.copy_(s)
        return loss / len(evals)

    def outer_step(avg):
        # avg: the ranks' mean pseudo-gradient (flat); the outer optimizer takes it as a gradient
        o = 0
        for s in shared:
            s.grad = avg[o : o + s.numel()].view_as(s).clone()
            o += s.numel()
        outer.step()

    losses = [held_out()]
    pending = None  # (work, flat buffer) of the round in flight
    dist.barrier()
    t0 = time.perf_counter()
    for _round in range(args.rounds):
        start = [p.detach().clone() for p in params]
        for _ in range(args.inner):
            x, y = batch(train_ids, model.ctx, args.batch, g)
            inner.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            inner.step()
        with torch.no_grad():
            delta = torch.cat([(s - p.detach()).flatten() for s, p in zip(start, params)])
        if not overlap:
            flat.copy_(delta)
            dist.all_reduce(flat)
            outer_step(flat / world)
            with torch.no_grad():
                for p, s in zip(params, shared):
                    p.copy_(s)
        else:
            if pending is not None:
                work, buf = pending
                work.wait()
                outer_step(buf / world)
                # the local copy: the new shared model plus this round's own progress
                with torch.no_grad():
                    o = 0
                    for p, s in zip(params, shared):
                        p.copy_(s - delta[o : o + p.numel()].view_as(p))
                        o += p.numel()
            buf = delta.clone()
            pending = (dist.all_reduce(buf, async_op=True), buf)
        losses.append(held_out())
    if pending is not None:  # the last round's outer step
        work, buf = pending
        work.wait()
        outer_step(buf / world)
        losses[-1] = held_out()
    wall = time.perf_counter() - t0
    dist.barrier()
    dist.destroy_process_group()
    return losses, wall, flat.numel()


def _rank_entry(rank, world, args, name, init_method, out_json):
    backend, cfg, overlap = RUNS[name]
    result = train(rank, world, args, backend, cfg, overlap, init_method)
    if rank == 0 and out_json:
        with open(out_json, "w") as f:
            json.dump(result, f)
    return result


def run_loopback(args, name):
    import tempfile

    from qcomm.spawn import run_ranks

    init = "file://" + os.path.join(tempfile.mkdtemp(prefix="diloco-"), "store")
    return run_ranks(
        _rank_entry, args.world, args, name, init, None, backend=None, timeout=args.timeout
    )[0]


def run_namespaces(args, name):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import slow_cluster

    out_json = os.path.join(args.out, f"rank0-{name.replace(' ', '_')}.json")
    argv = ["--run", name, "--json", out_json] + args.argv
    if slow_cluster.run_workers(__file__, args.world, args.rate, None, argv, args.timeout) != 0:
        raise SystemExit(f"{name}: a rank failed")
    with open(out_json) as f:
        return json.load(f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--inner", type=int, default=10, help="H, inner steps per round")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--rate", default=None, help="emulated link (root), e.g. 1gbit")
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--port", type=int, default=29590)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--run", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.worker:
        sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
        import slow_cluster

        init = f"tcp://{slow_cluster.SUBNET}.1:{args.port}"
        _rank_entry(args.rank, args.world, args, args.run, init, args.json)
        return 0
    args.argv = [a for a in sys.argv[1:]]
    names = [n for n in args.runs.split(",") if n]
    for n in names:
        if n not in RUNS:
            raise SystemExit(f"unknown run {n!r}; known: {', '.join(RUNS)}")
    results = {}
    for n in names:
        print(f"[diloco] {n} ...", flush=True)
        losses, wall, numel = (run_namespaces if args.rate else run_loopback)(args, n)
        results[n] = (losses, wall)
        print(f"[diloco] {n}: final held-out loss {losses[-1]:.4f}, wall {wall:.1f} s", flush=True)
    link = args.rate or "loopback"
    print(
        f"# {args.world} ranks, {link}, {numel / 1e6:.2f} M parameters, {args.rounds} rounds "
        f"of H={args.inner} inner steps (batch {args.batch})"
    )
    print("| run | final held-out loss | vs exact | vs its exact twin | wall s | vs exact |")
    print("|---|---|---|---|---|---|")
    base = results.get("exact")
    for n, (losses, wall) in results.items():
        twin = results.get("exact overlap" if n.endswith("overlap") else "exact")
        rl = f"{losses[-1] / base[0][-1]:.4f}" if base else "-"
        rt = f"{losses[-1] / twin[0][-1]:.4f}" if twin else "-"
        rw = f"{wall / base[1]:.2f}" if base else "-"
        print(f"| {n} | {losses[-1]:.4f} | {rl} | {rt} | {wall:.1f} | {rw} |")
    with open(os.path.join(args.out, "diloco.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "round", "held_out_loss", "wall_s", "link"])
        for n, (losses, wall) in results.items():
            for r, loss in enumerate(losses):
                w.writerow([n, r, loss, wall, link])
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for n, (losses, wall) in results.items():
            ax.plot(range(len(losses)), losses, label=f"{n} ({wall:.0f} s)")
        ax.set_xlabel(f"outer round (H={args.inner} inner steps each)")
        ax.set_ylabel("held-out cross-entropy (nats/char)")
        ax.set_title(f"DiLoCo, {args.world} ranks, {link}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "diloco_loss.png"), dpi=120)
        print(f"[diloco] wrote {os.path.join(args.out, 'diloco_loss.png')}")
    except ImportError:
        print("[diloco] matplotlib missing: no PNG")
    return 0


if __name__ == "__main__":
    sys.exit(main())
