"""Accuracy sweep (issue 4): the real extension's allreduce error against the float64 exact sum,
over algorithm x bits x group size x symmetric x world size x input distribution.

For every case (W ranks as threads over real Gloo, tests/inproc.py):

* every rank holds the same bits, and they equal qcomm/reference.py's model bit for bit;
* relative L2 error, max absolute error and SQNR (dB) are within what the codec math gives: the
  reference's per-element bound B (sum of scale/2 over every quantization an element passes
  through, plus fp32 rounding) gives |err| <= B element-wise, max|err| <= max B,
  rel L2 <= ||B||_2 / ||exact||_2 and SQNR >= -20 log10(||B||_2 / ||exact||_2).

Then the orderings that must hold at the same bits and configuration (test_orderings). Each is a
statement about the *expected* error, not about every input: the errors are sums of rounding errors
of data-dependent steps, and on one specific input the worse method can be the luckier one. At
32K elements per rank, N(0,1) inputs never broke an ordering on any seed, but single seeds did on
heavy-tailed and outlier inputs while the pooled error kept the ordering: semi_ring <= ring, LLM-
like, world 8, group 1024 asymmetric, 4/8: ring/semi_ring 0.90 on one seed, 1.17 pooled over three;
4/8 <= 4/4, Student-t, world 2, group 1024, two_step: 0.94 on one seed, 1.17 pooled. So every
ordering is asserted on the error pooled over SEEDS, sqrt(sum of squared errors / sum of squared
exact sums), never per seed.

Orderings asserted (relative L2 error, pooled):

* more bits never worse: 8/8 <= 4/8 <= 4/4; 8/None <= 8/8; None/8 <= 8/8 (every distribution);
* semi_ring <= ring for world >= 4; at world 2 the two are the same computation (asserted equal);
* two_step <= ring for world >= 4; at world 2 the same computation too (the owner's own values
  exact plus the peer's decoded copy; asserted equal);
* with rs None (no quantized reduce phase) the schedules differ only in fp32 summation order, so
  their errors are asserted equal within 0.1% instead of ordered.

Where they do not hold (measured with this file's inputs and seeds, ratio = ring error / other
error, < 1 means the ordering fails; see test_ordering_known_exceptions). The two_step figures
below were measured while two_step still quantized the owner's own copy (W quantizations in the
reduce phase; since 2026-12-06 W - 1, the owner's own values exact): the orderings and exceptions
asserted here held again after that change (`-m full_sweep`), the ratios were not re-measured.

* two_step <= ring and semi_ring <= ring fail systematically, not by chance, on sparse inputs
  (95% zeros; two_step: pooled ratio down to 0.86 at world 4, 14 of 24 configurations fail at
  world 4, 5 of 24 at world 8) and on inputs whose magnitude differs across ranks (rank r scaled by
  10^(r-2); two_step: down to 0.76, 19 of 24 configurations fail at worlds 4 and 8; semi_ring:
  down to 0.80). The model behind the ordering (each ring hop adds an error proportional to the
  partial sum's range, which grows like sqrt(k) after k ranks) does not fit these inputs. With 95%
  zeros the non-zeros of different ranks rarely overlap, the partial sums' group ranges barely
  grow, and every hop costs about one single-rank quantization: ring's W-1 hops against
  two_step's W quantizations (world 4, group 128, 8 bits: the hops add 0.9e-5, 1.4e-5, 1.0e-5 of
  MSE; two_step's four quantizations 3.5e-5 together). With magnitudes 10^(r-2) the error is that
  of the largest rank's values: two_step quantizes them once in every chunk; ring leaves them
  unquantized in the chunk that rank owns, and requantizing them after adding values that are
  small against the step lands on nearly the same grid (second hop: 1.4e-4 against 3.5e-3). These
  are xfail(strict=True) at representative configurations, so they show in every run and are
  flagged if the behaviour changes.
* two_step <= ring at world 4 on heavy-tailed (Student-t, 3 dof) and outlier-channel (LLM-like)
  inputs is a near tie: ring's W-1 = 3 hops against two_step's W = 4 separate quantizations, and a
  group's range there is set by one extreme element, so it barely grows along the ring. Pooled
  over the three seeds it still fails at group 1024 symmetric 4/4 on Student-t (ratio 0.987; an
  exploration over 6 other seeds saw 0.99 pooled and 0.93 on single seeds). At world 4 on those two
  distributions it is therefore asserted with an explicit 5% tolerance (TIE_TOL); at world 8 it is
  strict (pooled margin >= 11%).

The full grid (3 x 5 x 3 x 2 x 3 x 6 = 1620 configurations, each over len(SEEDS) inputs) is
marked full_sweep; an unmarked representative subset runs by default.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import zlib
from typing import Dict, List, Optional, Tuple

import inproc
import pytest
import torch

import qcomm
from qcomm import reference as ref

N_PER_RANK = 4096 * 8  # elements per rank: 8 rows of hidden size 4096
HIDDEN = 4096
OUTLIER_CHANNELS = 6
OUTLIER_FACTOR = 30.0
SEEDS = (0, 1, 2)

ALGOS = ("two_step", "ring", "semi_ring")
BITS: Tuple[Tuple[Optional[int], Optional[int]], ...] = (
    (8, 8),
    (4, 8),
    (4, 4),
    (8, None),
    (None, 8),
)
GROUPS = (32, 128, 1024)
SYMS = (True, False)
WORLDS = (2, 4, 8)
DISTS = ("normal", "student_t3", "llm", "all_equal", "mostly_zeros", "mixed_ranks")

# errors at or below this relative L2 are fp32 rounding, not quantization (all_equal inputs)
ATOL_REL = 1e-6
# two_step <= (1 + TIE_TOL) * ring at world 4 on heavy-tailed / outlier inputs (see docstring)
TIE_TOL = 0.05


def make_inputs(dist: str, world: int, seed: int, n: int = N_PER_RANK) -> List[torch.Tensor]:
    """Per-rank fp32 tensors of n elements (n a multiple of HIDDEN for "llm")."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{dist}/{world}/{seed}".encode()))
    if dist == "llm":
        # activations: rows of hidden size 4096, a handful of outlier channels 30x larger, the
        # same channels on every rank (as in a tensor-parallel layer's partial outputs)
        channels = torch.randperm(HIDDEN, generator=g)[:OUTLIER_CHANNELS]
    value = float(torch.randn((), generator=g))
    xs = []
    for r in range(world):
        if dist == "normal":
            x = torch.randn(n, generator=g)
        elif dist == "student_t3":
            z = torch.randn(n, generator=g)
            chi2 = torch.randn(3, n, generator=g).square().sum(0)
            x = z / (chi2 / 3.0).sqrt()
        elif dist == "llm":
            x = torch.randn(n // HIDDEN, HIDDEN, generator=g)
            x[:, channels] *= OUTLIER_FACTOR
            x = x.flatten()
        elif dist == "all_equal":
            x = torch.full((n,), value)
        elif dist == "mostly_zeros":
            x = torch.randn(n, generator=g) * (torch.rand(n, generator=g) < 0.05)
        elif dist == "mixed_ranks":
            x = torch.randn(n, generator=g) * 10.0 ** (r - 2)
        else:
            raise ValueError(dist)
        xs.append(x.contiguous())
    return xs


@dataclasses.dataclass
class Run:
    """One allreduce of one input (one seed)."""

    seed: int
    rel_l2: float
    max_abs: float
    sqnr_db: float
    rel_bound: float  # ||bound||_2 / ||exact||_2
    max_bound: float
    elementwise_ok: bool  # |err| <= bound everywhere
    worst_ratio: float  # max |err| / bound
    ranks_agree: bool
    equals_reference: bool
    sq_err: float
    sq_exact: float


@dataclasses.dataclass
class Config:
    runs: List[Run]

    @property
    def pooled_rel(self) -> float:
        """Relative L2 error pooled over the seeds."""
        return math.sqrt(sum(r.sq_err for r in self.runs) / sum(r.sq_exact for r in self.runs))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    na, nb = torch.isnan(a), torch.isnan(b)
    return torch.equal(na, nb) and torch.equal(a[~na], b[~nb])


def measure(out: torch.Tensor, r: ref.Result) -> Dict[str, float]:
    err = out.double() - r.exact
    sq_err = float(err.square().sum())
    sq_exact = float(r.exact.square().sum())
    rel = math.sqrt(sq_err / sq_exact)
    rel_bound = float(r.bound.norm()) / math.sqrt(sq_exact)
    return dict(
        rel_l2=rel,
        max_abs=float(err.abs().max()),
        sqnr_db=10 * math.log10(sq_exact / sq_err) if sq_err > 0 else math.inf,
        rel_bound=rel_bound,
        max_bound=float(r.bound.max()),
        elementwise_ok=bool((err.abs() <= r.bound).all()),
        worst_ratio=float((err.abs() / r.bound).max()),
        sq_err=sq_err,
        sq_exact=sq_exact,
    )


@functools.lru_cache(maxsize=None)
def _inputs(dist: str, world: int, seed: int) -> Tuple[torch.Tensor, ...]:
    return tuple(make_inputs(dist, world, seed))


@functools.lru_cache(maxsize=None)
def sweep_case(dist: str, world: int, gs: int, sym: bool) -> Dict[Tuple[str, tuple], Config]:
    """All algorithms x bits for one (distribution, world, group size, symmetric), over SEEDS."""
    g = inproc.group(world)
    res: Dict[Tuple[str, tuple], Config] = {}
    threads = torch.get_num_threads()
    # the reference's small ops are much faster single-threaded, above all on a loaded machine
    torch.set_num_threads(1)
    try:
        for algo, bits in itertools.product(ALGOS, BITS):
            res[(algo, bits)] = _one_config(g, dist, world, algo, bits, gs, sym)
    finally:
        torch.set_num_threads(threads)
    return res


def _one_config(g, dist, world, algo, bits, gs, sym) -> Config:
    # the unrotated codec at every bit width (rotation, on by default at 4 bits, has its own
    # tests: tests/codec/test_rotation.py)
    cfg = qcomm.QuantConfig(
        algorithm=algo,
        rs_bits=bits[0],
        ag_bits=bits[1],
        group_size=gs,
        symmetric=sym,
        min_bytes=0,
        rotate=False,
    )
    g.set_config(cfg)
    runs = []
    for seed in SEEDS:
        xs = list(_inputs(dist, world, seed))
        outs = g.allreduce(xs)
        r = ref.allreduce(xs, algo, bits[0], bits[1], gs, sym, rotate=False)
        runs.append(
            Run(
                seed=seed,
                ranks_agree=all(_same_bits(o, outs[0]) for o in outs[1:]),
                equals_reference=_same_bits(outs[0], r.out),
                **measure(outs[0], r),
            )
        )
    return Config(runs)


# ---- which cases run by default ----

FULL = list(itertools.product(DISTS, WORLDS, GROUPS, SYMS))
# representative: every distribution, every world size, every group size, both codecs, at least
# once; includes the configurations the known-exception tests use
SUBSET = [
    ("normal", 4, 128, False),
    ("normal", 8, 32, True),
    ("student_t3", 8, 128, False),
    ("llm", 4, 128, False),
    ("llm", 8, 1024, True),
    ("all_equal", 4, 32, True),
    ("all_equal", 2, 128, False),
    ("mostly_zeros", 4, 1024, False),
    ("mixed_ranks", 8, 128, False),
    ("mixed_ranks", 2, 32, True),
]


def _ids(case):
    dist, world, gs, sym = case
    return f"{dist}-w{world}-g{gs}-{'sym' if sym else 'asym'}"


def _params(cases=FULL, subset=SUBSET):
    out = []
    for case in cases:
        marks = () if case in subset else (pytest.mark.full_sweep,)
        out.append(pytest.param(*case, marks=marks, id=_ids(case)))
    return out


# ---- the tests ----


@pytest.mark.parametrize("dist,world,gs,sym", _params())
def test_error_within_codec_bound(dist, world, gs, sym):
    res = sweep_case(dist, world, gs, sym)
    for (algo, bits), cfg in res.items():
        for run in cfg.runs:
            where = f"{algo} bits={bits} seed={run.seed}"
            assert run.ranks_agree, f"{where}: ranks hold different bits"
            assert run.equals_reference, f"{where}: differs from qcomm/reference.py"
            assert run.elementwise_ok, f"{where}: max |err|/bound = {run.worst_ratio:.3f}"
            assert run.max_abs <= run.max_bound, f"{where}: {run.max_abs} > {run.max_bound}"
            assert run.rel_l2 <= run.rel_bound, f"{where}: rel {run.rel_l2} > {run.rel_bound}"
            sqnr_min = -20 * math.log10(run.rel_bound) if run.rel_bound > 0 else math.inf
            assert run.sqnr_db >= sqnr_min, f"{where}: SQNR {run.sqnr_db} < {sqnr_min} dB"
            if dist == "all_equal":
                # constant groups are (all but) lossless: what is left is fp32 rounding
                assert run.rel_l2 <= ATOL_REL, f"{where}: rel {run.rel_l2} on constant input"
            else:
                # the measurement is not vacuous: the quantization error is really there
                assert run.rel_l2 > 0, where


# (ordering, distribution) pairs that do not hold, measured; see the module docstring
KNOWN_EXCEPTIONS = {
    ("two_step<=ring", "mostly_zeros"),
    ("two_step<=ring", "mixed_ranks"),
    ("semi_ring<=ring", "mostly_zeros"),
    ("semi_ring<=ring", "mixed_ranks"),
}


def _le(res, a, b, tol=0.0):
    """(holds, message) for pooled rel error of config a <= (1 + tol) * that of config b."""
    ea, eb = res[a].pooled_rel, res[b].pooled_rel
    ok = ea <= eb * (1 + tol) + ATOL_REL
    return ok, f"{a}: {ea:.4e} vs {b}: {eb:.4e} (ratio {eb / ea if ea else math.inf:.4f})"


def orderings(dist, world, res):
    """Every ordering check for one case: list of (name, holds, message)."""
    checks = []
    for algo in ALGOS:
        for lo, hi in [
            ((8, 8), (4, 8)),
            ((4, 8), (4, 4)),
            ((8, None), (8, 8)),
            ((None, 8), (8, 8)),
        ]:
            checks.append((f"bits {lo}<={hi}", *_le(res, (algo, lo), (algo, hi))))
    for bits in BITS:
        for algo, name in (("semi_ring", "semi_ring<=ring"), ("two_step", "two_step<=ring")):
            a, b = (algo, bits), ("ring", bits)
            if world == 2:
                # at world 2 both are ring: semi_ring one hop right, none left; two_step the
                # owner's own values plus the peer's decoded copy, as the ring's one hop adds
                # them (fp32 addition commutes); the same bits
                same = res[a].pooled_rel == res[b].pooled_rel
                checks.append((f"{algo}==ring (world 2)", same, f"{bits}: they differ"))
            elif bits[0] is None:
                # no quantized reduce phase: every schedule sums fp32 partials and only the
                # summation order differs, so the errors are equal up to fp32 rounding flips
                ea, eb = res[a].pooled_rel, res[b].pooled_rel
                ok = abs(ea - eb) <= 1e-3 * max(ea, eb) + ATOL_REL
                checks.append((f"{algo}~=ring (rs None)", ok, _le(res, a, b)[1]))
            else:
                tied = algo == "two_step" and world == 4 and dist in ("student_t3", "llm")
                checks.append((name, *_le(res, a, b, TIE_TOL if tied else 0.0)))
    return checks


@pytest.mark.parametrize("dist,world,gs,sym", _params())
def test_orderings(dist, world, gs, sym):
    res = sweep_case(dist, world, gs, sym)
    failed = [
        f"{name}: {msg}"
        for name, ok, msg in orderings(dist, world, res)
        if not ok and (name, dist) not in KNOWN_EXCEPTIONS
    ]
    assert not failed, "\n".join(failed)


# Representative configurations of the known exceptions, measured (pooled over SEEDS): on sparse
# inputs and on inputs whose magnitude differs across ranks the ring is the more accurate schedule.
# Asserted as that reversed ordering, so a change in either direction is flagged.
EXCEPTION_CASES = [
    ("two_step<=ring", "mostly_zeros", 4, 1024, False),
    ("semi_ring<=ring", "mostly_zeros", 4, 1024, False),
    ("two_step<=ring", "mixed_ranks", 8, 128, False),
    ("semi_ring<=ring", "mixed_ranks", 8, 128, False),
]


@pytest.mark.parametrize(
    "name,dist,world,gs,sym",
    [pytest.param(*c, id=f"{c[0]}-{_ids(c[1:])}") for c in EXCEPTION_CASES],
)
def test_ring_more_accurate_on_sparse_and_mixed_inputs(name, dist, world, gs, sym):
    res = sweep_case(dist, world, gs, sym)
    checked = [(ok, msg) for n, ok, msg in orderings(dist, world, res) if n == name]
    assert checked, f"no {name} comparison was made"
    held = [msg for ok, msg in checked if ok]
    # the ordering fails for at least one bit width here (ring is better), as measured
    assert len(held) < len(checked), "the ordering now holds everywhere:\n" + "\n".join(held)
