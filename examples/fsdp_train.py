"""FSDP2 (fully_shard) training on a qnccl group: gradients reduce-scattered at rs_bits, and
optionally parameters all-gathered at ag_bits.

    python examples/fsdp_train.py --ranks 2                  # exact (Gloo) vs quantized gradients
    python examples/fsdp_train.py --ranks 2 --all-gather     # weights all-gathered at 8 bits too
    python examples/fsdp_train.py --ranks 4 --hsdp           # HSDP: the replicate dim on qnccl

examples/ddp_train.py's task (a small MLP learning a fixed random teacher, the same data, seed
and schedule on every run) with FSDP2 in place of DDP; each rank trains on its part of every
batch. What a user writes is in `train`: a qnccl default group with
QuantConfig(reduce_scatter=True) and a 1-D device mesh over it; FSDP2 then sends every gradient
reduce-scatter through qnccl.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_train  # noqa: E402  (the task: a fixed teacher MLP, its data and the student)


def train(
    rank: int,
    world: int,
    steps: int = 300,
    seed: int = 0,
    mp_dtype=None,
    hsdp=None,
    batch: int = 256,
    lr: float = 3e-3,
) -> dict:
    """examples/ddp_train.py's training with FSDP2 instead of DDP, on the default process group
    (qnccl or gloo, already initialised): each Linear and the model fully_shard'ed on a 1-D mesh
    of every rank, Adam with a cosine schedule, each rank on its part of every global batch.
    mp_dtype: a MixedPrecisionPolicy's param and reduce dtype. hsdp: a QuantConfig, for HSDP on a
    (2, world / 2) mesh ("rep", "shard") whose replicate dimension is a qnccl group with that
    config (the shard dimension stays on the default group's backend). Returns the held-out loss
    curve, the final held-out loss, the full parameters' digest (alike on every rank) and qcomm's
    stats of the qnccl group, if any."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import qcomm

    if hsdp is None:
        mesh = init_device_mesh("cpu", (world,))
    else:
        # QuantConfig travels through backend_override (it has the _timeout DeviceMesh reads)
        mesh = init_device_mesh(
            "cpu",
            (2, world // 2),
            mesh_dim_names=("rep", "shard"),
            backend_override={"rep": ("qnccl", hsdp)},
        )
    x, y, xe, ye = ddp_train.make_data()
    model = ddp_train.make_model()
    kw = {"mesh": mesh}
    if mp_dtype is not None:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=mp_dtype, reduce_dtype=mp_dtype)
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, **kw)
    fully_shard(model, **kw)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    order = torch.Generator().manual_seed(seed)
    per_rank = batch // world
    curve = []

    def evaluate():
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(model(xe).float(), ye))

    for step in range(steps):
        if step % 10 == 0:
            curve.append((step, evaluate()))
        idx = torch.randint(0, ddp_train.N_TRAIN, (batch,), generator=order)
        mine = idx[rank * per_rank : (rank + 1) * per_rank]
        loss = torch.nn.functional.mse_loss(model(x[mine]).float(), y[mine])
        opt.zero_grad(set_to_none=True)
        loss.backward()  # FSDP2 reduce-scatters each module's gradients
        opt.step()
        sched.step()
    final = evaluate()
    curve.append((steps, final))
    h = hashlib.sha1()
    for p in model.parameters():
        h.update(p.full_tensor().detach().contiguous().view(torch.uint8).numpy().tobytes())
    out = {"curve": curve, "final": final, "digest": h.hexdigest()}
    if dist.get_backend() == "qnccl":
        out["stats"] = qcomm.stats()
    elif hsdp is not None:
        out["stats"] = qcomm.stats(mesh.get_group("rep"))
    return out


def main() -> None:
    import qcomm
    from qcomm.spawn import run_ranks

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rs-bits", type=int, default=8)
    ap.add_argument("--all-gather", action="store_true", help="all-gather weights at ag_bits too")
    ap.add_argument("--ag-bits", type=int, default=8)
    ap.add_argument(
        "--hsdp",
        action="store_true",
        help="HSDP on a (2, ranks / 2) mesh: Gloo inside a replica, qnccl across replicas",
    )
    a = ap.parse_args()
    exact = run_ranks(train, a.ranks, a.steps, backend="gloo")
    if a.hsdp:
        cfg = qcomm.QuantConfig(min_bytes=0, rs_bits=a.rs_bits, ag_bits=a.ag_bits)
        hsdp = run_ranks(train, a.ranks, a.steps, 0, None, cfg, backend="gloo")
        by = hsdp[0]["stats"]["by_collective"]
        print(f"exact (Gloo): final held-out MSE {exact[0]['final']:.5f}")
        print(
            f"HSDP, replicate dimension on qnccl: final held-out MSE {hsdp[0]['final']:.5f} "
            f"({hsdp[0]['final'] / exact[0]['final'] - 1:+.2%}); "
            f"{by['all_reduce']['quantized_calls']} allreduces quantized"
        )
        return
    cfg = qcomm.QuantConfig(
        min_bytes=0,
        rs_bits=a.rs_bits,
        ag_bits=a.ag_bits,
        reduce_scatter=True,
        all_gather=a.all_gather,
    )
    quant = run_ranks(train, a.ranks, a.steps, pg_options=cfg)
    by = quant[0]["stats"]["by_collective"]
    print(f"exact (Gloo): final held-out MSE {exact[0]['final']:.5f}")
    print(
        f"qnccl: final held-out MSE {quant[0]['final']:.5f} "
        f"({quant[0]['final'] / exact[0]['final'] - 1:+.2%}); "
        f"{by['reduce_scatter']['quantized_calls']} reduce-scatters and "
        f"{by['all_gather']['quantized_calls']} all-gathers quantized"
    )


if __name__ == "__main__":
    main()
