"""Probe: two processes sharing one GPU through CUDA IPC, each running a kernel that spins on a
flag the other process writes. Measures whether cross-process flags are seen at all under
time-slicing, and the round-trip latency of a flag ping-pong, to size the spin bounds of the
CUDA-IPC transport's tests. Needs a GPU and CuPy (present on the device machine, not in our venv).

    python benchmarks/ipc_probe.py --rounds 200
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.multiprocessing as mp

SRC = r"""
extern "C" __global__ void pingpong(volatile int* mine, volatile int* theirs, int rounds,
                                    int first, long long bound, long long* out) {
  long long spins = 0, t0 = clock64();
  for (int i = 1; i <= rounds; ++i) {
    if (first) { *mine = i; __threadfence_system(); }
    long long s = clock64();
    while (*theirs < i) {
      ++spins;
      if (clock64() - s > bound) { out[0] = -i; out[1] = spins; return; }
    }
    if (!first) { *mine = i; __threadfence_system(); }
  }
  out[0] = rounds; out[1] = spins; out[2] = clock64() - t0;
}
"""


def worker(rank, q_in, q_out, rounds):
    import cupy as cp

    torch.cuda.set_device(0)
    if rank == 0:
        flags = torch.zeros(64, dtype=torch.int32, device="cuda")
        q_out.put(flags)
    else:
        flags = q_in.get()
    k = cp.RawKernel(SRC, "pingpong")
    out = torch.zeros(4, dtype=torch.int64, device="cuda")
    mine = flags[0 if rank == 0 else 32 :]
    theirs = flags[32 if rank == 0 else 0 :]
    bound = 2_000_000_000 * 10  # about 10 s at 2 GHz
    t = time.perf_counter()
    k(
        (1,),
        (1,),
        (
            cp.asarray(mine),
            cp.asarray(theirs),
            cp.int32(rounds),
            cp.int32(1 if rank == 0 else 0),
            cp.int64(bound),
            cp.asarray(out),
        ),
    )
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    o = out.tolist()
    print(
        f"rank {rank}: rounds {o[0]} spins {o[1]} wall {dt * 1e3:.1f} ms "
        f"({dt / max(1, rounds) * 1e6:.1f} us per round trip)",
        flush=True,
    )
    if rank == 0:
        q_in.get()  # keep the shared allocation alive until the peer is done
    else:
        q_out.put(True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    qa, qb = ctx.Queue(), ctx.Queue()
    # rank 0 puts the tensor on qb, rank 1 reads qb; rank 1 signals done on qa
    p0 = ctx.Process(target=worker, args=(0, qa, qb, args.rounds))
    p1 = ctx.Process(target=worker, args=(1, qb, qa, args.rounds))
    p0.start()
    p1.start()
    p0.join(120)
    p1.join(120)
    ok = p0.exitcode == 0 and p1.exitcode == 0
    print("ipc probe:", "ok" if ok else f"FAILED exit codes {p0.exitcode} {p1.exitcode}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
