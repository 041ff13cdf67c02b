"""A fixed set of quantized allreduces whose wire bytes and results are recorded in
tests/algo/data/wire_fixture.json, so that a refactoring can show it changed neither.

Ranks are threads of this process over real Gloo backends, each wrapped in a recording backend
(_testing.RecordingBackend) that logs every send (peer, tag, length, a digest of the
bytes), every posted receive (peer, tag, length), the plan header's exchange, and the sizes of
collectives. For each case and rank the fixture holds a digest of the output's bytes and a digest
of the sorted wire log. Two paths run: the backend's allreduce (what dist.all_reduce does on CPU
tensors), and the collective schedule that CUDA tensors take (NCCL's shape, here over Gloo).
Quantized reduce-scatters and all-gathers (the backend's _reduce_scatter_base and
_allgather_base) follow, appended after the allreduces so that those keep their inputs, and the
rotated ones (each shard padded to whole groups) after them.

    python tests/algo/wire_cases.py --record   # rewrite the fixture: only when a change is
                                               # meant to change the wire (say so in the commit)
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import sys

import torch
import torch.distributed as dist

import qcomm
from qcomm import _testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import inproc  # noqa: E402 (tests/inproc.py)

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "wire_fixture.json")

ALGOS = ["two_step", "ring", "semi_ring"]
BITS = [(8, 8), (4, 8), (4, 4), (None, 8), (8, None)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
NUMELS = [1, 1000, 65539, 300001]
WORLDS = [2, 3, 4]


def cases():
    """(name, world, path, config fields, dtype, numel, average) for every case, in run order."""
    out = []
    for world in WORLDS:
        for i, (algo, (rs, ag), dtype, numel) in enumerate(
            itertools.product(ALGOS, BITS, DTYPES, NUMELS)
        ):
            # every (algo, bits, dtype) at two sizes, rotating; the mode rotates over the rest
            if (i + world) % 2:
                continue
            cfg = dict(
                algorithm=algo,
                rs_bits=rs,
                ag_bits=ag,
                min_bytes=0,
                microshards=(1, 3, 4)[(i // 2 + world) % 3],
                symmetric=bool((i // 3) % 2),
                stochastic_rounding=bool((i // 5) % 2),
                rotate=(i % 7 == 0),
            )
            avg = bool((i // 4) % 2)
            name = f"W{world} {algo} {rs}/{ag} {str(dtype)[6:]} n={numel} " + " ".join(
                f"{k}={v}" for k, v in cfg.items() if k not in ("algorithm", "rs_bits", "ag_bits")
            )
            out.append((name + f" avg={avg}", world, "allreduce", cfg, dtype, numel, avg))
            if not cfg["rotate"] and i % 3 == 0:
                c = dict(cfg)
                out.append(
                    (name + f" avg={avg} collective", world, "collective", c, dtype, numel, avg)
                )
    # sharded: `avg` holds the reduce-scatter's op ("sum", "avg", "premul": PREMUL_SUM(0.5)), or
    # for an all-gather whether its input is its own slot of the output (in place)
    for world in WORLDS:
        for i, (algo, rs, dtype, shard) in enumerate(
            itertools.product(ALGOS, (8, 4), DTYPES, (1, 129, 1000, 65539))
        ):
            if (i + world) % 2:
                continue
            cfg = dict(
                algorithm=algo,
                rs_bits=rs,
                ag_bits=rs,
                min_bytes=0,
                microshards=(1, 3, 4)[(i // 2 + world) % 3],
                symmetric=bool((i // 3) % 2),
                stochastic_rounding=bool((i // 5) % 2),
                rotate=False,
                reduce_scatter=True,
                all_gather=True,
            )
            name = f"W{world} {algo} {rs} {str(dtype)[6:]} shard={shard} " + " ".join(
                f"{k}={v}" for k, v in cfg.items() if k in ("microshards", "symmetric")
            )
            op = ("sum", "avg", "premul")[i % 3]
            rs_name = name + f" stochastic={cfg['stochastic_rounding']} op={op} reduce_scatter"
            out.append((rs_name, world, "reduce_scatter", cfg, dtype, shard * world, op))
            if algo == "two_step":  # the all-gather has one schedule
                in_place = bool(i % 2)
                ag_name = name + f" in_place={in_place} all_gather"
                out.append((ag_name, world, "all_gather", cfg, dtype, shard * world, in_place))
    # sharded and rotated (appended after the unrotated ones, so that those keep their inputs):
    # each shard padded to whole groups; 4 bits with rotate unset (on), 8 bits with rotate=True
    for world in WORLDS:
        for i, (algo, dtype, shard) in enumerate(
            itertools.product(ALGOS, (torch.float32, torch.bfloat16), (31, 129, 1000))
        ):
            if (i + world) % 2:
                continue
            bits, rotate = ((4, None), (8, True))[(i // 2) % 2]
            cfg = dict(
                algorithm=algo,
                rs_bits=bits,
                ag_bits=bits,
                min_bytes=0,
                microshards=(1, 3, 4)[(i // 2 + world) % 3],
                symmetric=bool((i // 3) % 2),
                stochastic_rounding=bool((i // 5) % 2),
                rotate=rotate,
                reduce_scatter=True,
                all_gather=True,
            )
            name = f"W{world} {algo} {bits} {str(dtype)[6:]} shard={shard} rotate={rotate} " + (
                " ".join(f"{k}={cfg[k]}" for k in ("microshards", "symmetric"))
            )
            op = ("sum", "avg", "premul")[i % 3]
            rs_name = name + f" stochastic={cfg['stochastic_rounding']} op={op} reduce_scatter"
            out.append((rs_name, world, "reduce_scatter", cfg, dtype, shard * world, op))
            if algo == "two_step":
                in_place = bool(i % 2)
                ag_name = name + f" in_place={in_place} all_gather"
                out.append((ag_name, world, "all_gather", cfg, dtype, shard * world, in_place))
    return out


def _inputs(world, numel, dtype, seed):
    xs = []
    for r in range(world):
        g = torch.Generator().manual_seed(seed * 100 + r)
        x = torch.randn(numel, generator=g) * (1.0 + r)
        if numel > 10:
            x[numel // 3] = 40.0 * (r + 1)  # an outlier, so groups differ in scale
        xs.append(x.to(dtype))
    return xs


def _sha(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()[:16]


def _call(g, r, outs, path, avg, ins=None):
    if path == "reduce_scatter":
        o = dist.ReduceScatterOptions()
        o.reduceOp = inproc.reduce_op(avg, 0.5)
        g.backends[r]._reduce_scatter_base(outs[r], ins[r], o).wait()
    elif path == "all_gather":
        o = torch._C._distributed_c10d.AllgatherOptions()
        g.backends[r]._allgather_base(outs[r], ins[r], o).wait()
    elif path == "allreduce":
        o = dist.AllreduceOptions()
        o.reduceOp = dist.ReduceOp.AVG if avg else dist.ReduceOp.SUM
        g.backends[r].allreduce([outs[r]], o).wait()
    else:
        outs[r] = _testing.collective_allreduce_for_test(g.backends[r], outs[r], avg)


def run_cases():
    """{case name: [[output digest, wire digest, header digest, messages] per rank]}: the plan
    header's exchange (the all-gathers of plan_header_bytes() bytes) is digested apart from the
    rest of the wire, so that a change of the header alone shows no other byte moved."""
    header_bytes = _testing.plan_header_bytes()
    result = {}
    groups = {}
    for seed, (name, world, path, cfg, dtype, numel, avg) in enumerate(cases()):
        if world not in groups:
            groups[world] = inproc.InProcGroup(world, 120.0, _testing.RecordingBackend)
        g = groups[world]
        xs = _inputs(world, numel, dtype, seed)
        outs, ins = [x.clone() for x in xs], None
        n = numel // world
        if path == "reduce_scatter":
            ins, outs = outs, [torch.empty(n, dtype=dtype) for _ in xs]
        elif path == "all_gather":
            outs = [torch.zeros(numel, dtype=dtype) for _ in xs]
            if avg:  # in place: the input is this rank's slot of the output
                ins = [outs[r].narrow(0, r * n, n) for r in range(world)]
                for r in range(world):
                    ins[r].copy_(xs[r][:n])
            else:
                ins = [x[:n].clone() for x in xs]
        config = qcomm.QuantConfig(**cfg).encoded()
        for b in g.backends:
            b.set_config(config)
        for rec in g.inner:
            rec.clear()

        g.on_all(
            lambda r, g=g, outs=outs, path=path, avg=avg, ins=ins: _call(g, r, outs, path, avg, ins)
        )
        per_rank = []
        for r in range(world):
            log = [tuple(e) for e in g.inner[r].log()]
            if path == "collective":
                # what NCCL would carry: its units are padded to one size with bytes never
                # written, and NCCL has no tags, so kinds, peers and sizes only
                log = [(e[0], e[1], e[3]) for e in log]
            log = sorted(log)
            numel = 2 if path == "collective" else 3  # where an entry holds its length
            header = [e for e in log if e[0] == "allgather" and e[numel] == header_bytes]
            payload = [e for e in log if e not in header]
            wire = _sha(repr(payload).encode())
            out = _sha(outs[r].contiguous().view(torch.uint8).numpy().tobytes())
            per_rank.append([out, wire, _sha(repr(header).encode()), len(log)])
        result[name] = per_rank
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--record", action="store_true", help="rewrite the fixture")
    a = ap.parse_args()
    got = run_cases()
    if a.record:
        os.makedirs(os.path.dirname(FIXTURE), exist_ok=True)
        with open(FIXTURE, "w") as f:
            json.dump(got, f, indent=0, sort_keys=True)
            f.write("\n")
        print(f"recorded {len(got)} cases into {FIXTURE}")
    else:
        with open(FIXTURE) as f:
            want = json.load(f)
        bad = [k for k in want if got.get(k) != want[k]]
        print(f"{len(want) - len(bad)} of {len(want)} cases unchanged")
        for k in bad[:20]:
            print("changed:", k, want[k], got.get(k))


if __name__ == "__main__":
    main()
