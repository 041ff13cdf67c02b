"""ZeRO-1 on qnccl with 4-bit traffic: every rank keeps the full weights in one flat buffer (the
parameters are views into it), reduce-scatters the gradients, steps the shard it owns (AdamW on
an fp32 master copy of that shard) and all-gathers the updated shards into the full weights.

The model is a small GPT (`TinyGPT`: --layers of examples/native_tp.py's pre-norm blocks,
learned positions, characters of the State of the Union addresses from 2001 on, as
examples/diloco.py reads them). The default group is qnccl with two_step; the options choose
what is quantized:

  --grad-bits 4|8     gradients reduce-scattered at that many bits (4: rotated)
  --feedback          and the reduce phase's error fed back (qcomm.feedback.ReduceFeedback)
  --weight-bits 4|8   weights all-gathered at that many bits
  --deltas            as differences from what every rank holds (qcomm.delta.DeltaAllGather)

Without options everything is exact (algorithm="none"). Every rank prints the held-out loss at
the end; rank 0 also how many calls were quantized and fell back.

    torchrun --nproc_per_node 2 examples/zero1.py --grad-bits 4 --feedback --weight-bits 4 --deltas
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import diloco  # noqa: E402  (the text)
import native_tp  # noqa: E402  (the block)


class TinyGPT(torch.nn.Module):
    """Character embeddings and learned positions, `layers` pre-norm transformer blocks (causal
    attention and a GELU MLP), a final norm and a linear head."""

    def __init__(self, vocab: int, ctx: int = 64, dim: int = 128, layers: int = 4, heads: int = 4):
        super().__init__()
        self.ctx = ctx
        self.tok = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Parameter(torch.zeros(ctx, dim))
        self.blocks = torch.nn.ModuleList(native_tp.Block(dim, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, x):
        h = self.tok(x) + self.pos[: x.shape[1]]
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))


def sequences(ids, ctx: int, size: int, g: torch.Generator):
    """`size` windows of ctx + 1 characters: inputs and their next characters."""
    at = torch.randint(0, len(ids) - ctx - 1, (size,), generator=g)
    w = torch.stack([ids[i : i + ctx + 1] for i in at.tolist()])
    return w[:, :-1], w[:, 1:]


def config(grad_bits=None, feedback=False, weight_bits=None, deltas=False, **codec):
    """The default group's QuantConfig for these options (exact without any); `codec`: more
    QuantConfig fields (group_size, rotate)."""
    import qcomm

    if grad_bits is None and weight_bits is None:
        return qcomm.QuantConfig(algorithm="none")
    return qcomm.QuantConfig(
        algorithm="two_step",
        tune=False,
        min_bytes=0,
        reduce_scatter=grad_bits is not None,
        rs_bits=grad_bits or 8,
        all_gather=weight_bits is not None,
        ag_bits=weight_bits or 8,
        **codec,
    )


def _flatten(model, world: int):
    """One flat buffer for the weights and one for the gradients, W shards long (padded); every
    parameter and its .grad become views into them."""
    total = sum(p.numel() for p in model.parameters())
    n = -(-total // world) * world
    full, grads = torch.zeros(n), torch.zeros(n)
    off = 0
    for p in model.parameters():
        k = p.numel()
        full[off : off + k].copy_(p.detach().flatten())
        p.data = full[off : off + k].view_as(p)
        p.grad = grads[off : off + k].view_as(p)
        off += k
    return full, grads


class Trainer:
    """One rank's ZeRO-1 state on `group` (default: the default group): the model with its flat
    weights and gradients, the fp32 master of this rank's shard and its AdamW, and the options'
    state (feedback's error, the difference all-gather). comm_dtype: send the gradients and
    weights in that dtype instead (Gloo in bf16: what a user sends on a fast link), cast back;
    comm=False: no communication at all (the step's compute alone). dim: the model's width."""

    def __init__(self, rank, world, vocab, steps, lr=3e-3, seed=0, feedback=False, deltas=False,
                 group=None, comm_dtype=None, comm=True, dim=128):  # fmt: skip
        import torch.distributed as dist

        import qcomm
        from qcomm.delta import DeltaAllGather
        from qcomm.feedback import ReduceFeedback

        torch.manual_seed(seed)
        self.rank, self.world, self.group = rank, world, group
        self.model = TinyGPT(vocab, dim=dim, heads=max(4, dim // 32))
        self.full, self.grads = _flatten(self.model, world)
        self.shard = self.full.numel() // world
        self.master = self.full[rank * self.shard : (rank + 1) * self.shard].clone()
        self.opt = torch.optim.AdamW([self.master], lr=lr, weight_decay=0.01)
        self.sched = torch.optim.lr_scheduler.CosineAnnealingLR(self.opt, steps)
        self.comm, self.comm_dtype = comm, comm_dtype
        on_qnccl = comm and dist.get_backend(group) == qcomm.BACKEND
        self.cfg = qcomm.get_config(group) if on_qnccl else None
        self.rs_plan = None
        if self.cfg is not None:
            self.rs_plan = qcomm.plan(self.grads, group=group, collective="reduce_scatter")
        self.fb = ReduceFeedback() if feedback else None
        self.gather = DeltaAllGather(self.full, group) if deltas else None

    def step(self, x, y) -> float:
        """One training step on this rank's batch; returns the seconds its communication took
        (the reduce-scatter, the all-gather and their bookkeeping)."""
        import time

        import torch.distributed as dist

        self.grads.zero_()
        logits = self.model(x)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        t0 = time.perf_counter()
        self.master.grad = torch.empty(self.shard)
        if not self.comm:
            self.master.grad.copy_(self.grads.view(self.world, -1)[self.rank])
        elif self.comm_dtype is not None:
            out = torch.empty(self.shard, dtype=self.comm_dtype)
            sent = self.grads.to(self.comm_dtype)
            dist.reduce_scatter_tensor(out, sent, op=dist.ReduceOp.AVG, group=self.group)
            self.master.grad.copy_(out)
        else:
            message = self.grads
            if self.fb is not None:
                message = self.fb.compensate(self.grads, self.group, self.rs_plan, self.cfg)
            dist.reduce_scatter_tensor(
                self.master.grad, message, op=dist.ReduceOp.AVG, group=self.group
            )
        took = time.perf_counter() - t0
        self.opt.step()
        self.sched.step()
        t0 = time.perf_counter()
        if not self.comm:
            self.full.view(self.world, -1)[self.rank].copy_(self.master)
        elif self.comm_dtype is not None:
            got = torch.empty(self.full.numel(), dtype=self.comm_dtype)
            dist.all_gather_into_tensor(got, self.master.to(self.comm_dtype), group=self.group)
            self.full.copy_(got)
        elif self.gather is not None:
            self.gather(self.master)
        else:
            dist.all_gather_into_tensor(self.full, self.master, group=self.group)
        return took + time.perf_counter() - t0

    def loss(self, x, y) -> float:
        """The cross-entropy of the model's predictions of `y` from `x`."""
        with torch.no_grad():
            logits = self.model(x)
            return float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()))


def train(rank, world, steps=400, batch=32, lr=3e-3, seed=0, feedback=False, deltas=False):
    """One run on the initialized default group; returns the final held-out loss, the held-out
    loss every 50 steps, the counters and a digest of the final weights."""
    import hashlib

    import torch.distributed as dist

    import qcomm

    train_ids, held_ids, vocab = diloco.load_text()
    t = Trainer(rank, world, vocab, steps, lr, seed, feedback, deltas)
    order = torch.Generator().manual_seed(1000 + seed)
    held = sequences(held_ids, t.model.ctx, 256, torch.Generator().manual_seed(7))
    per_rank = batch // world
    curve = []
    for step in range(steps):
        x, y = sequences(train_ids, t.model.ctx, batch, order)
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        t.step(x[mine], y[mine])
        if (step + 1) % 50 == 0:
            curve.append((step + 1, t.loss(*held)))
    out = {"final": t.loss(*held), "curve": curve}
    out["digest"] = hashlib.sha256(t.full.numpy().tobytes()).hexdigest()
    if dist.get_backend() == qcomm.BACKEND:
        by = qcomm.stats()["by_collective"]
        out["rs_q"] = by["reduce_scatter"]["quantized_calls"]
        out["ag_q"] = by["all_gather"]["quantized_calls"]
        out["fallbacks"] = t.gather.fallbacks if t.gather is not None else 0
        out["error_bytes"] = t.fb.nbytes() if t.fb is not None else 0
    return out


def main() -> int:
    import torch.distributed as dist

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grad-bits", type=int, choices=(4, 8))
    ap.add_argument("--feedback", action="store_true")
    ap.add_argument("--weight-bits", type=int, choices=(4, 8))
    ap.add_argument("--deltas", action="store_true")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg = config(a.grad_bits, a.feedback, a.weight_bits, a.deltas)
    dist.init_process_group("qnccl", pg_options=cfg)
    rank, world = dist.get_rank(), dist.get_world_size()
    out = train(rank, world, a.steps, seed=a.seed, feedback=a.feedback, deltas=a.deltas)
    print(f"[rank {rank}] held-out loss {out['final']:.4f}; " + ", ".join(
        f"{k} {v}" for k, v in out.items() if k in ("rs_q", "ag_q", "fallbacks")))  # fmt: skip
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
