"""Accuracy of qnccl's quantized allreduce beside the numbers the two papers report (issue 4).

Every number comes from the real extension: W ranks as threads of this process over real Gloo
(tests/inproc.py), each rank's output checked identical to every other rank's, the error taken
against the float64 sum of the inputs. Each configuration runs over --seeds independent inputs and
is reported as mean +- standard deviation over them.

1. EQuARX (arXiv 2506.17615): N(0,1) inputs, int8, block (group) 64, symmetric; mean squared error
   of the allreduce output against the exact sum for the full-loop ring with both phases quantized,
   the semi-loop ring, all-gather only (rs None / ag 8) and reduce-scatter only (rs 8 / ag None),
   at one world size, then the same against world size 2..16.
2. Flash Communication (arXiv 2412.04964): two_step, world 4 (their TP=4), asymmetric group 128 as
   their default; error against group size 32..1024 for INT8 (8/8), INT6 (rs 4 / ag 8) and INT4
   (4/4); quantizing only before the reduce (rs b / ag None) against only before the gather
   (rs None / ag b); on N(0,1) and on LLM-like activations (rows of hidden size 4096, 6 channels
   30x larger, the same channels on every rank).

    .venv/bin/python benchmarks/accuracy_tables.py                       # about 2 min on 2 cores
    .venv/bin/python benchmarks/accuracy_tables.py --numel 65536 --seeds 1 --out /tmp/t.md
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import statistics
import sys
import textwrap
import time
import zlib

import qbench
import torch

ROOT = qbench.ROOT
sys.path.insert(0, os.path.join(ROOT, "tests"))  # inproc: the tests' in-process ranks

import inproc  # noqa: E402

import qcomm  # noqa: E402

HIDDEN = 4096
OUTLIERS = 6
OUTLIER_FACTOR = 30.0

# EQuARX, PAPERS.md: MSE on N(0,1) tensors, int8, block 64, symmetric (world and size not stated)
EQUARX = [
    # (label, algorithm, rs, ag, paper MSE)
    ("full-loop ring, both phases", "ring", 8, 8, 0.0014),
    ("semi-loop ring, both phases", "semi_ring", 8, 8, 0.001),
    ("all-gather only", "ring", None, 8, 0.0003),
    ("reduce-scatter only", "ring", 8, None, None),
    ("two_step (Flash), both phases", "two_step", 8, 8, None),
]
# the column headers of the table against world size
EQUARX_SHORT = {
    "full-loop ring, both phases": "full loop",
    "semi-loop ring, both phases": "semi loop",
    "two_step (Flash), both phases": "two_step",
}
FLASH_BITS = [("INT8", 8, 8), ("INT6", 4, 8), ("INT4", 4, 4)]
FLASH_GROUPS = [32, 64, 128, 256, 512, 1024]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def inputs(dist: str, world: int, numel: int, seed: int):
    g = torch.Generator().manual_seed(zlib.crc32(f"{dist}/{world}/{numel}/{seed}".encode()))
    if dist == "normal":
        return [torch.randn(numel, generator=g) for _ in range(world)]
    if dist == "llm":
        channels = torch.randperm(HIDDEN, generator=g)[:OUTLIERS]
        xs = []
        for _ in range(world):
            x = torch.randn(numel // HIDDEN, HIDDEN, generator=g)
            x[:, channels] *= OUTLIER_FACTOR
            xs.append(x.flatten())
        return xs
    raise ValueError(dist)


class Runner:
    """Runs configurations on cached inputs and exact sums; returns per-seed metrics."""

    def __init__(self, numel: int, seeds: int):
        self.numel, self.seeds = numel, seeds
        self._data = {}
        self.calls = 0

    def _inputs(self, dist, world, seed):
        key = (dist, world, seed)
        if key not in self._data:
            self._data.clear()  # keep one world's inputs at a time (16 x 4 MiB at world 16)
        if key not in self._data:
            xs = inputs(dist, world, self.numel, seed)
            exact = torch.zeros(self.numel, dtype=torch.float64)
            for x in xs:
                exact += x.double()
            self._data[key] = (xs, exact)
        return self._data[key]

    def run(self, dist, world, algorithm, rs, ag, group_size, symmetric):
        """{metric: [value per seed]} with metrics mse, rel (relative L2), sqnr (dB), maxabs."""
        g = inproc.group(world)
        cfg = qcomm.QuantConfig(
            algorithm=algorithm,
            rs_bits=rs,
            ag_bits=ag,
            group_size=group_size,
            symmetric=symmetric,
            min_bytes=0,
        )
        g.set_config(cfg)
        out = {"mse": [], "rel": [], "sqnr": [], "maxabs": []}
        for seed in range(self.seeds):
            xs, exact = self._inputs(dist, world, seed)
            outs = g.allreduce(xs)
            self.calls += 1
            for o in outs[1:]:
                if not torch.equal(o, outs[0]):
                    raise RuntimeError(f"ranks disagree: {cfg} world {world} seed {seed}")
            err = outs[0].double() - exact
            sq_err, sq_exact = float(err.square().sum()), float(exact.square().sum())
            out["mse"].append(sq_err / self.numel)
            out["rel"].append(math.sqrt(sq_err / sq_exact))
            out["sqnr"].append(10 * math.log10(sq_exact / sq_err) if sq_err else math.inf)
            out["maxabs"].append(float(err.abs().max()))
        return out


def ms(vals, fmt="{:.3g}") -> str:
    """mean +- std over seeds (std omitted for a single seed)."""
    m = statistics.fmean(vals)
    if len(vals) < 2:
        return fmt.format(m)
    return f"{fmt.format(m)} ± {fmt.format(statistics.stdev(vals))}"


def mean(vals) -> float:
    return statistics.fmean(vals)


def table(header, rows) -> str:
    """A Markdown table (the library's)."""
    return qbench.md_table(header, rows)


def split_table(header, rows, key: int, first: int) -> str:
    """Two tables of the same rows, so that each line stays within 100 characters: columns
    [0, first) and then the key columns [0, key) again with the rest."""
    second = [r[:key] + r[first:] for r in rows]
    return "\n\n".join(
        [
            table(header[:first], [r[:first] for r in rows]),
            table(header[:key] + header[first:], second),
        ]
    )


def wrap(text: str, bullet: bool = False) -> str:
    """A paragraph (or, with bullet, a list item) wrapped at 100 characters."""
    return textwrap.fill(
        text,
        100,
        initial_indent="* " if bullet else "",
        subsequent_indent="  " if bullet else "",
        break_long_words=False,
        break_on_hyphens=False,
    )


def equarx_section(runner: Runner, world: int, worlds, progress) -> str:
    gs, sym = 64, True
    res = {}
    for w in worlds:
        for label, algo, rs, ag, _ in EQUARX:
            progress(f"EQuARX world {w}: {label}")
            res[(w, label)] = runner.run("normal", w, algo, rs, ag, gs, sym)
    if world not in worlds:
        for label, algo, rs, ag, _ in EQUARX:
            progress(f"EQuARX world {world}: {label}")
            res[(world, label)] = runner.run("normal", world, algo, rs, ag, gs, sym)
    out = [
        "## EQuARX (arXiv 2506.17615): int8 allreduce error on N(0,1)",
        "",
        wrap(
            f"Setting: every rank's tensor N(0,1), fp32, {runner.numel} elements per rank "
            f"(2^{int(math.log2(runner.numel))}), int8, group (block) {gs}, symmetric "
            "(absmax/127); mean squared error of the allreduce output against the float64 exact "
            f"sum; mean ± std over {runner.seeds} seeds. EQuARX's world size and tensor size are "
            f"not stated in docs/PAPERS.md; we chose world {world} and "
            f"2^{int(math.log2(runner.numel))} elements per rank, and sweep the world size below. "
            "EQuARX's unquantized phases presumably ship bf16; ours ship the fp32 input (`None`), "
            "so its 'X only' rows carry no bf16 rounding here."
        ),
        "",
        f"### World {world}",
        "",
    ]
    rows = []
    for label, algo, rs, ag, paper in EQUARX:
        r = res[(world, label)]
        rows.append(
            [
                label,
                f"`{algo}`",
                f"{rs}/{ag}",
                ms(r["mse"], "{:.3e}"),
                "—" if paper is None else f"{paper:g}",
                "—" if paper is None else f"{mean(r['mse']) / paper:.2f}",
                ms(r["rel"], "{:.3e}"),
                ms(r["sqnr"], "{:.2f}"),
                f"{max(r['maxabs']):.3g}",
            ]
        )
    hdr = ["configuration", "algorithm", "rs/ag bits", "MSE (ours)", "MSE (paper)", "ours/paper"]
    hdr += ["rel. L2", "SQNR dB", "max abs err"]
    out.append(split_table(hdr, rows, 1, 6))
    out += [
        "",
        "### MSE against world size",
        "",
        wrap(
            "Same setting; mean over seeds (the spread is in the tables above for world "
            f"{world}). The MSE is absolute: the exact sum's variance is W, so it grows with W "
            "even at a fixed relative error. Full loop, semi loop and two_step have both phases "
            "quantized."
        ),
        "",
    ]
    labels = [e[0] for e in EQUARX]
    rows = [[w] + [f"{mean(res[(w, lb)]['mse']):.3e}" for lb in labels] for w in worlds]
    out.append(table(["world"] + [EQUARX_SHORT.get(lb, lb) for lb in labels], rows))
    out += ["", "Rows closest to the paper's numbers (in log distance):", ""]
    for label, _, _, _, paper in EQUARX:
        if paper is None:
            continue
        w_best = min(worlds, key=lambda w: abs(math.log(mean(res[(w, label)]["mse"]) / paper)))
        got = mean(res[(w_best, label)]["mse"])
        out.append(wrap(f"{label}: paper {paper:g}; closest at world {w_best} ({got:.3e})", True))
    if 2 in worlds:
        out += ["", *_equarx_model(res, worlds)]
    out.append("")
    return "\n".join(out)


def _hops(label: str, w: int) -> float:
    """Quantizations of an N(0,1)-sized value per element, each weighted by the variance of the
    partial sum it quantizes (a partial sum of k ranks has k times the variance of one)."""
    ring_rs = w * (w - 1) / 2  # hops carry partial sums of 1, 2, ..., W-1 ranks
    right, left = w // 2, (w - 1) // 2
    semi_rs = right * (right + 1) / 2 + left * (left + 1) / 2
    return {
        "full-loop ring, both phases": ring_rs + w,
        "semi-loop ring, both phases": semi_rs + w,
        "all-gather only": w,
        "reduce-scatter only": ring_rs,
        # the W - 1 other ranks' copies once each (the owner's own values are exact), the sum of
        # W ranks once in the gather phase
        "two_step (Flash), both phases": (w - 1) + w,
    }[label]


def _equarx_model(res, worlds):
    """Compare the table with the quantization-count model and read the paper's world size off
    the ratios of its numbers (which do not depend on the block shape)."""
    # one quantization of an N(0,1) element: the reduce-scatter-only ring at world 2 does exactly
    # one (the non-owner's chunk), and the owner's addition is exact
    u = mean(res[(2, "reduce-scatter only")]["mse"])
    dev = max(
        abs(mean(res[(w, e[0])]["mse"]) / (u * _hops(e[0], w)) - 1) for w in worlds for e in EQUARX
    )
    full, semi, ag = (e[4] for e in EQUARX[:3])
    ws = range(2, 65)
    w_full = min(ws, key=lambda w: abs(_hops(EQUARX[0][0], w) / w - full / ag))
    w_semi = min(ws, key=lambda w: abs(_hops(EQUARX[1][0], w) / w - semi / ag))
    return [
        wrap(
            f"Model: one int8 quantization of an N(0,1) element costs u = {u:.3e} of MSE "
            "(measured: reduce-scatter only at world 2, where each element is quantized once), "
            "and a partial sum of k ranks costs k u. Then full loop = u (W(W-1)/2 + W), semi loop "
            "= u (R(R+1)/2 + L(L+1)/2 + W) with R = floor(W/2), L = floor((W-1)/2), all-gather "
            "only = u W, reduce-scatter only = u W(W-1)/2, two_step = u (2W - 1) (its owner's own "
            "values enter exact). It matches every "
            f"cell of the table above within {100 * dev:.1f}%."
        ),
        "",
        wrap(
            "Under this model the ratios of the paper's numbers do not depend on u (block shape, "
            f"scale rounding): full loop / all-gather only = {full / ag:.2f}, which the model "
            f"gives at world {w_full}; semi loop / all-gather only = {semi / ag:.2f}, at world "
            f"{w_semi}. So the three numbers are consistent with each other and with about "
            f"{w_full}-{w_semi} ranks, if EQuARX's inputs were independent N(0,1) per rank and "
            "its unquantized phase added no rounding of its own (a bf16 all-gather would add "
            "some)."
        ),
    ]


def flash_section(runner: Runner, world: int, progress) -> str:
    algo, sym, gs0 = "two_step", False, 128
    dists = [("normal", "N(0,1)"), ("llm", f"LLM-like ({OUTLIERS} channels x{OUTLIER_FACTOR:g})")]
    out = [
        "## Flash Communication (arXiv 2412.04964): two_step ablations",
        "",
        wrap(
            f"Setting: `two_step`, world {world} (Flash used TP=4), asymmetric min/max groups, "
            f"{runner.numel} elements per rank, fp32; mean ± std over {runner.seeds} seeds. "
            f"LLM-like: rows of hidden size {HIDDEN}, N(0,1) except {OUTLIERS} channels "
            f"{OUTLIER_FACTOR:g}x larger, the same channels on every rank. The paper reports these "
            "ablations as model accuracy (perplexity, task scores), not as tensor error; its "
            "findings are quoted beside ours."
        ),
        "",
    ]
    for dist, name in dists:
        rows = []
        res = {}
        for gs in FLASH_GROUPS:
            for bname, rs, ag in FLASH_BITS:
                progress(f"Flash {dist} group {gs} {bname}")
                res[(gs, bname)] = runner.run(dist, world, algo, rs, ag, gs, sym)
            rows.append(
                [gs]
                + [ms(res[(gs, b)]["rel"], "{:.3e}") for b, _, _ in FLASH_BITS]
                + [f"{mean(res[(gs, b)]['sqnr']):.2f}" for b, _, _ in FLASH_BITS]
            )
        out += [
            f"### Relative L2 error against group size, {name}",
            "",
            "Flash: finer groups help down to 128.",
            "",
            split_table(
                ["group"]
                + [f"{b} ({rs}/{ag}) rel. L2" for b, rs, ag in FLASH_BITS]
                + [f"{b} SQNR dB" for b, _, _ in FLASH_BITS],
                rows,
                1,
                1 + len(FLASH_BITS),
            ),
            "",
        ]
    out += [
        f"### Bits and where to quantize, group {gs0}",
        "",
        wrap(
            "Flash: INT6 (INT4 reduce, INT8 gather) stays close to INT8, INT4 costs accuracy; "
            "quantizing before the all-gather accumulates more error than before the reduce."
        ),
        "",
    ]
    rows = {dist: [] for dist, _ in dists}
    placement = [
        ("INT8", 8, 8),
        ("INT6", 4, 8),
        ("INT4", 4, 4),
        ("before reduce only, 4-bit", 4, None),
        ("before gather only, 4-bit", None, 4),
        ("before reduce only, 8-bit", 8, None),
        ("before gather only, 8-bit", None, 8),
    ]
    res = {}
    for label, rs, ag in placement:
        for dist, _ in dists:
            progress(f"Flash {dist} {label}")
            r = res[(dist, label)] = runner.run(dist, world, algo, rs, ag, gs0, sym)
            rows[dist].append(
                [label, f"{rs}/{ag}", ms(r["rel"], "{:.3e}"), f"{mean(r['sqnr']):.2f}"]
                + [ms(r["mse"], "{:.3e}")]
            )
    # one table per input distribution, so that each line stays within 100 characters
    tables = [
        table(["configuration", "rs/ag bits", f"{name} rel. L2", "SQNR dB", "MSE"], rows[dist])
        for dist, name in dists
    ]
    out += ["\n\n".join(tables), ""]
    for dist, name in dists:
        e = {b: mean(res[(dist, b)]["rel"]) for b in ("INT8", "INT6", "INT4")}
        rs4 = mean(res[(dist, "before reduce only, 4-bit")]["rel"])
        item = (
            f"{name}: INT6 / INT8 rel. L2 = {e['INT6'] / e['INT8']:.1f}x, INT4 / INT6 = "
            f"{e['INT4'] / e['INT6']:.2f}x; INT6's error is its 4-bit reduce phase "
            f"(4/None alone: {rs4:.3e})"
        )
        out.append(wrap(item, True))
    out.append("")
    out += [
        wrap(
            "Quantizing before the reduce only against before the gather only (ratio = rel. L2 "
            "before gather / before reduce):"
        ),
        "",
    ]
    for dist, name in dists:
        for b in (4, 8):
            reduce_only = res[(dist, f"before reduce only, {b}-bit")]["rel"]
            gather_only = res[(dist, f"before gather only, {b}-bit")]["rel"]
            ratio = mean(gather_only) / mean(reduce_only)
            if abs(ratio - 1) <= 0.02:
                verdict = "about equal (within 2%)"
            else:
                verdict = f"before the {'gather' if ratio > 1 else 'reduce'} is worse"
            out.append(wrap(f"{name}, {b}-bit: ratio {ratio:.3f}, {verdict}", True))
    out += [
        "",
        wrap(
            "With independent, identically distributed rank inputs: before the reduce, W - 1 "
            "quantizations of groups of range r (the owner's own values enter exact); before the "
            "gather, one quantization of the sum, whose groups have range about sqrt(W) r. So "
            "quantizing before the gather costs sqrt(W / (W - 1)) times the error of quantizing "
            "before the reduce in expectation (1.155 at world 4; Flash's all-to-all, which "
            "quantizes the owner's slot too, makes the two equal). Flash measured model accuracy "
            "on real activations; these synthetic inputs are not that."
        ),
    ]
    out.append("")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "accuracy_tables.md"))
    ap.add_argument("--numel", type=int, default=1 << 20, help="elements per rank (default 2^20)")
    ap.add_argument("--seeds", type=int, default=3, help="independent inputs per configuration")
    ap.add_argument("--equarx-world", type=int, default=8)
    ap.add_argument("--max-world", type=int, default=16, help="world sweep 2..max-world")
    ap.add_argument("--flash-world", type=int, default=4)
    args = ap.parse_args()
    if args.numel % HIDDEN:
        ap.error(f"--numel must be a multiple of {HIDDEN} (LLM-like rows)")

    t0 = time.perf_counter()
    runner = Runner(args.numel, args.seeds)
    worlds = list(range(2, args.max_world + 1))
    n_worlds = len(worlds) + (args.equarx_world not in worlds)
    n_steps = n_worlds * len(EQUARX) + len(FLASH_GROUPS) * len(FLASH_BITS) * 2 + 7 * 2
    step = [0]

    def progress(msg):
        step[0] += 1
        log(f"[{step[0]}/{n_steps} {time.perf_counter() - t0:6.1f}s] {msg}")

    parts = [
        "# qnccl allreduce accuracy beside the papers",
        "",
        wrap(
            "Command: `"
            + " ".join([".venv/bin/python benchmarks/accuracy_tables.py"] + sys.argv[1:])
            + "`"
        ),
        "",
        wrap(
            f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} "
            f"{platform.release()}, torch {torch.__version__}, qcomm CPU path (Gloo transport); "
            f"{datetime.date.today().isoformat()}. Ranks are threads of one process "
            "(tests/inproc.py); the results are the extension's, bit-identical on every rank and "
            "(by the test suite) to qcomm/reference.py."
        ),
        "",
        equarx_section(runner, args.equarx_world, worlds, progress),
        flash_section(runner, args.flash_world, progress),
    ]
    elapsed = time.perf_counter() - t0
    parts.append(f"Elapsed: {elapsed:.0f} s for {runner.calls} allreduces.\n")
    text = "\n".join(parts)
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    log(f"wrote {args.out} ({elapsed:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
