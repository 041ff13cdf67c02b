"""4-bit training traffic at the accuracy of exact training (issue 49), SDP4Bit's Table 1 at CPU
scale: examples/zero1.py's ZeRO-1 training of a small GPT (4 pre-norm blocks, dim 128, 64
characters of context) on the State of the Union addresses from 2001 on, 2 ranks, each arm
from the same initial weights and data order, its final held-out cross-entropy against the exact
run's and against the spread of exact runs over --seeds seeds. Arms:

  exact s0..      every collective exact (algorithm="none"), seeds 0, 1, 2
  g4              gradients reduce-scattered at 4 bits (rotated), weights exact
  g4_ef           the same with the reduce phase's error fed back (qcomm.feedback)
  w8              weights all-gathered directly at 8 bits, gradients exact
  w4              weights all-gathered directly at 4 bits
  w4_delta        weights at 4 bits as differences (qcomm.delta.DeltaAllGather)
  all4            gradients at 4 bits with feedback, weights at 4 bits as differences
  g4_coarse       gradients at 4 bits in groups of 1024, unrotated: a codec that errs more
  g4_coarse_ef    the same with feedback

Rank 0 prints each run's final held-out loss, its difference from exact s0, the exact seeds'
spread, the calls quantized, and for the gradient arms the share of g4's gap each closes.

    .venv/bin/python benchmarks/zero1_accuracy.py --steps 400
    .venv/bin/python benchmarks/zero1_accuracy.py --seeds 1 --arms g4_coarse,g4_coarse_ef
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import qbench

sys.path.insert(0, os.path.join(qbench.ROOT, "examples"))

import zero1  # noqa: E402

ARMS = {  # examples/zero1.py's options (and QuantConfig fields) of each arm
    "g4": dict(grad_bits=4),
    "g4_ef": dict(grad_bits=4, feedback=True),
    "w8": dict(weight_bits=8),
    "w4": dict(weight_bits=4),
    "w4_delta": dict(weight_bits=4, deltas=True),
    "all4": dict(grad_bits=4, feedback=True, weight_bits=4, deltas=True),
    "g4_coarse": dict(grad_bits=4, group_size=1024, rotate=False),
    "g4_coarse_ef": dict(grad_bits=4, group_size=1024, rotate=False, feedback=True),
}


def _run(rank, world, steps, seed, feedback, deltas):
    return zero1.train(rank, world, steps, seed=seed, feedback=feedback, deltas=deltas)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--arms", default=",".join(ARMS))
    a = ap.parse_args()
    results = {}
    runs = [(f"exact s{s}", {}, s) for s in range(a.seeds)]
    runs += [(name, ARMS[name], 0) for name in a.arms.split(",") if name]
    for name, opts, seed in runs:
        t0 = time.perf_counter()
        r = qbench.run_ranks(
            _run, 2, a.steps, seed, opts.get("feedback", False), opts.get("deltas", False),
            pg_options=zero1.config(**opts), timeout=3600,
        )  # fmt: skip
        assert r[0]["digest"] == r[1]["digest"], f"{name}: the ranks' weights differ"
        results[name] = (r[0], time.perf_counter() - t0)
        curve = " ".join(f"{loss:.3f}" for _, loss in r[0]["curve"])
        print(f"{name}: {r[0]['final']:.4f} (every 50 steps: {curve})", flush=True)
    exact = [results[f"exact s{s}"][0]["final"] for s in range(a.seeds)]
    base, mean = exact[0], sum(exact) / len(exact)
    print(
        f"# ZeRO-1, TinyGPT (4 blocks, dim 128) on sotu, 2 ranks, {a.steps} steps; exact spread "
        f"over {a.seeds} seeds {(max(exact) - min(exact)) / mean:.2%} "
        f"(min {min(exact):.4f}, max {max(exact):.4f})"
    )
    head = ["run", "held-out loss", "vs exact s0", "RS quantized", "AG quantized", "fallbacks"]
    head.append("wall s")
    rows = []
    for name, (r, wall) in results.items():
        rows.append([name, f"{r['final']:.4f}", f"{r['final'] / base - 1:+.3%}",
                     r.get("rs_q", ""), r.get("ag_q", ""), r.get("fallbacks", ""),
                     f"{wall:.0f}"])  # fmt: skip
    print(qbench.md_table(head, rows))
    for plain in ("g4", "g4_coarse"):
        if plain in results and plain + "_ef" in results:
            gap = results[plain][0]["final"] - base
            left = results[plain + "_ef"][0]["final"] - base
            print(
                f"{plain}'s gap {gap:+.4f}; with feedback {left:+.4f}: closed {1 - left / gap:.0%}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
