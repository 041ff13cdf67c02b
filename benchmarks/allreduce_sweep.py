"""Latency sweep of qnccl's quantized allreduce against an exact allreduce: Gloo's on local CPU
ranks, or NCCL's on GPUs under torchrun.

    .venv/bin/python benchmarks/allreduce_sweep.py                      # defaults, ~2 min
    .venv/bin/python benchmarks/allreduce_sweep.py --sizes 1M,16M --bits 8/8 --iters 9
    torchrun --standalone --nproc_per_node=8 benchmarks/allreduce_sweep.py --device cuda

For each message size (CPU default 4K, 16K, ..., 256M; CUDA default 1M, 4M, ..., 1G: powers of 4)
it times, on --world spawned CPU ranks over loopback (Gloo's TCP transport), or on the ranks of a
torchrun launch (RANK and WORLD_SIZE set; --world is then the launch's):

* ``gloo <dtype>`` (CUDA: ``nccl <dtype>``): the exact allreduce of the input in its own dtype (the
  first baseline);
* ``gloo bf16`` (``nccl bf16``): cast the input to bf16 (into a preallocated buffer), the exact
  allreduce of that, cast back into the input; its time includes both casts (the allreduce alone
  is reported under the table). Skipped when --dtype is bf16 (it would be the first baseline);
* every --algorithms x --bits pair of qnccl's quantized allreduce; with --device cuda, over each
  of --transports (``two_step@ipc``: two_step over CUDA IPC), each transport in a group of its own
  (QCOMM_TRANSPORT is read at a group's first quantized CUDA allreduce, made at the start).

With --device cuda (torchrun only) each rank runs on cuda:(LOCAL_RANK % GPUs), with
QCOMM_CUDA_QUANTIZE=1. NCCL refuses two ranks on one GPU: where ranks share GPUs (more ranks on a
host than it has GPUs) there is no NCCL baseline and no NCCL transport, the speed-up columns say
"-" and a footer line says that the cross-GPU part needs 2+ GPUs, one per rank; ranks that share a
GPU run by time-slicing, so their times are not those of a multi-GPU run (``cuda_plan``).

Each is measured as in the main job, benchmarks/allreduce_bench.py (the library's runner,
qbench.Runner): a fresh copy of the same deterministic input per call, a barrier, one call timed on
every rank, the max over ranks;
--warmup untimed calls, then --iters timed ones (--small-iters below --small-size, where calls are
cheap and noisy; at most --large-iters from --large-size on, to bound the run time). A call's time
is the host clock around it on CPU and CUDA events around it on the rank's stream on GPUs. time_us
is the median of the timed calls, min_us/max_us their spread.
algbw = size/time and busbw = algbw*2(W-1)/W (nccl-tests' definitions); speedup_exact and
speedup_bf16 are the baselines' median times over this row's. wire_bytes: bytes rank 0 sent per call
(qnccl's counter; for the baseline rows the nominal ring volume 2(W-1)/W of the message in the wire
dtype, not a measurement). rel_err = ||out - exact||_2 / ||exact||_2 and max_abs_err against the
float64 sum of all ranks' inputs (regenerated from their seeds), for the last call's output;
identical: every call's output had the same bits on every rank.

--predict LINK (CUDA, one GPU per rank) adds benchmarks/cost_model.py's predicted time of each row
it can model (qnccl rows whose phases both quantize; the exact NCCL row), serial and overlapped,
from the kernel times of --kernel-csv (default: the ones measured on one H200) and the link LINK
(cost_model's name=GB/s[:alpha_us], e.g. nvlink=370): predictions, beside the measurement.

Output: the table on stdout, progress lines (count, elapsed, ETA) on stderr, the rows in a CSV
(--csv, written as rows finish) and PNG plots in --plot-dir: speedup_vs_size.png (speedup against
each baseline vs message size, one line per algorithm x bits; not drawn without a baseline),
rel_err_vs_bits.png (relative error vs bits, one line per algorithm, with the baselines' errors)
and time_vs_size.png (latency curves, predictions dotted). The speedup plot shades the sizes whose
exact baseline's max/min time ratio is above 5: there the medians are mostly scheduling noise.
--from-csv PATH redraws the table and plots of an earlier run (of a partial one too).

The rank function, ``sweep_rank(rank, world, opts)``, only needs an initialised default process
group whose backend is qnccl, so another launcher (torchrun, ranks in network namespaces) can call
it.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import os
import statistics
import sys
import time

import qbench  # (and cost_model) from this folder, on sys.path; the spawned ranks inherit it

DEFAULT_SIZES = {"cpu": "4K,16K,64K,256K,1M,4M,16M,64M,256M", "cuda": "1M,4M,16M,64M,256M,1G"}
DEFAULT_DTYPE = {"cpu": "fp32", "cuda": "bf16"}
DEFAULT_OUT = os.path.join(qbench.ROOT, "benchmarks", "out")
BASELINES = {"cpu": "gloo", "cuda": "nccl"}  # the exact allreduce of each device's rows
BASELINE_NAMES = {"gloo": "Gloo", "nccl": "NCCL"}
TRANSPORTS = ("ipc", "nccl")
COLUMNS = [
    "size",
    "count",
    "dtype",
    "algorithm",
    "bits",
    "iters",
    "time_us",
    "min_us",
    "max_us",
    "algbw",
    "busbw",
    "wire_bytes",
    "speedup_exact",
    "speedup_bf16",
    "rel_err",
    "max_abs_err",
    "identical",
]
PRED_COLUMNS = ["pred_serial_us", "pred_overlap_us"]  # --predict: benchmarks/cost_model.py
_LEFT = {"dtype", "algorithm", "bits", "identical"}
NOISY = 5  # plots shade sizes whose exact-baseline max/min time ratio is above this


# ---------------------------------------------------------------------------------------------
# options


def parse_transports(text: str) -> list:
    """'ipc,nccl' -> ['ipc', 'nccl'], each one of TRANSPORTS (QCOMM_TRANSPORT's forced values)."""
    out = [t.strip().lower() for t in text.split(",") if t.strip()]
    for t in out:
        if t not in TRANSPORTS:
            raise argparse.ArgumentTypeError(
                f"bad transport {t!r}; allowed: {', '.join(TRANSPORTS)}"
            )
    if not out:
        raise argparse.ArgumentTypeError("--transports is empty")
    return list(dict.fromkeys(out))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Latency sweep: qnccl's quantized allreduce vs the exact allreduce (input "
        "dtype and bf16) over message sizes, algorithms and bit widths: Gloo's on local CPU ranks, "
        "or NCCL's on GPUs under torchrun (--device cuda).",
    )
    p.add_argument(
        "--device",
        choices=sorted(BASELINES),
        default="cpu",
        help="cpu: spawned CPU ranks (or torchrun's); cuda: torchrun's ranks on GPUs (default cpu)",
    )
    p.add_argument(
        "--world", type=int, default=2, help="number of spawned ranks (default 2; torchrun: its)"
    )
    p.add_argument(
        "--sizes",
        type=qbench.parse_sizes,
        default=None,
        help="message sizes in bytes, K/M/G = 2^10/2^20/2^30 (default "
        f"{DEFAULT_SIZES['cpu']} on cpu, {DEFAULT_SIZES['cuda']} on cuda)",
    )
    p.add_argument(
        "--dtype",
        choices=sorted(qbench.DTYPES),
        default=None,
        help="default fp32 (cpu), bf16 (cuda)",
    )
    p.add_argument(
        "--algorithms",
        type=qbench.parse_algorithms,
        default=["two_step", "ring", "semi_ring"],
        help="comma-separated (default two_step,ring,semi_ring)",
    )
    qbench.add_codec_args(p)
    p.add_argument(
        "--transports",
        type=parse_transports,
        default=None,
        help="--device cuda: the CUDA transports of the qnccl rows, each its own group (default "
        "ipc,nccl; the ones the GPUs do not allow are left out, and the header says why)",
    )
    p.add_argument(
        "--predict",
        metavar="LINK",
        default=None,
        help="--device cuda, one GPU per rank: add the cost model's predicted times for this link, "
        "name=GB/s[:alpha_us] (e.g. nvlink=370 or pcie=25; benchmarks/COST_MODEL.md)",
    )
    p.add_argument(
        "--kernel-csv",
        metavar="PATH",
        default=None,
        help="with --predict: the kernel times the model reads, comma-separated CSVs (default "
        "benchmarks/data/h200_codec_kernels.csv, measured on one H200)",
    )
    p.add_argument(
        "--large-iters",
        type=int,
        default=5,
        help="at most this many timed calls per config from --large-size on, where one call takes "
        "up to a second (default 5)",
    )
    p.add_argument(
        "--large-size",
        type=qbench.parse_size,
        default=qbench.parse_size("256M"),
        help="sizes from this one on use --large-iters (default 256M)",
    )
    p.add_argument(
        "--small-iters",
        type=int,
        default=25,
        help="timed calls per config below --small-size, where one call is cheap and noisy; "
        "at least --iters (default 25)",
    )
    p.add_argument(
        "--small-size",
        type=qbench.parse_size,
        default=qbench.parse_size("1M"),
        help="sizes below this one use --small-iters (default 1M)",
    )
    qbench.add_run_args(p)
    p.add_argument(
        "--csv",
        metavar="PATH",
        default=os.path.join(DEFAULT_OUT, "allreduce_sweep.csv"),
        help="CSV of the rows (default benchmarks/out/allreduce_sweep.csv; '' for none)",
    )
    p.add_argument(
        "--plot-dir",
        metavar="DIR",
        default=DEFAULT_OUT,
        help="folder for the PNG plots (default benchmarks/out; '' for none)",
    )
    p.add_argument(
        "--timeout", type=float, default=3600.0, help="seconds before the run counts as hung"
    )
    p.add_argument(
        "--from-csv",
        metavar="PATH",
        default=None,
        help="measure nothing: print the table and draw the plots of a CSV this script wrote",
    )
    return p


def check_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Fills the device's defaults in and refuses, through the parser, what could not run."""
    if a.sizes is None:
        a.sizes = qbench.parse_sizes(DEFAULT_SIZES[a.device])
    if a.dtype is None:
        a.dtype = DEFAULT_DTYPE[a.device]
    if a.device == "cpu" and (a.transports or a.predict):
        p.error("--transports and --predict are for --device cuda")
    if a.transports is None:
        a.transports = list(TRANSPORTS)
    if a.kernel_csv and not a.predict:
        p.error("--kernel-csv goes with --predict")
    if a.predict:
        import cost_model as cm

        a.kernel_csv = a.kernel_csv or cm.DEFAULT_CSV
        try:
            if len(cm.parse_links(a.predict, 3.0)) != 1:
                raise ValueError("one link")
            cm.KernelCosts.from_csv(a.kernel_csv)
        except (OSError, ValueError, KeyError) as e:
            p.error(f"--predict {a.predict} --kernel-csv {a.kernel_csv}: {e}")
    if a.world < 2:
        p.error("--world must be at least 2 (under torchrun: --nproc_per_node x nodes)")
    if min(a.iters, a.large_iters, a.small_iters) < 1:
        p.error("--iters, --large-iters and --small-iters must be at least 1")
    qbench.check_run_args(p, a)
    try:
        for algo in a.algorithms:
            for rs, ag in a.bits:
                qbench.make_config(a, algo, rs, ag)
    except ValueError as e:
        p.error(str(e))


def iters_for(opts, size: int) -> int:
    if size >= opts.large_size:
        return min(opts.iters, opts.large_iters)
    if size < opts.small_size:
        return max(opts.iters, opts.small_iters)
    return opts.iters


def with_bf16_baseline(opts) -> bool:
    return opts.dtype != "bf16"


@dataclasses.dataclass
class CudaPlan:
    """What a CUDA sweep can run (the same on every rank: made from facts all ranks agreed on)."""

    gpus: int  # GPUs on a host (the fewest of any rank's)
    world: int
    local_world: int  # ranks on a host (the most of any)
    nccl: bool  # every rank has a GPU of its own: the NCCL baseline and the NCCL transport run
    transports: list  # of the ones asked for, those that can run
    notes: list  # why something asked for cannot run, for the header and the footer

    @property
    def shared(self) -> bool:
        """Whether ranks share a GPU (time-sliced: their times are not a multi-GPU run's)."""
        return not self.nccl


def cuda_plan(gpus: int, world: int, local_world: int, transports, peer: bool = True) -> CudaPlan:
    """The plan of a CUDA sweep of `world` ranks, `local_world` of them on each host of `gpus`
    GPUs, rank i on GPU (local rank i) % gpus; peer: whether those GPUs reach each other with
    peer access. NCCL refuses two ranks on one GPU, so the NCCL baseline and transport need a GPU
    per rank; CUDA IPC needs every rank on one host, at most 8 ranks and peer access
    (docs/cuda.md, "Two transports")."""
    if gpus < 1:
        raise ValueError("a CUDA sweep needs a GPU")
    nccl = gpus >= local_world
    why_not_ipc = [
        (world > 8, "more than 8 ranks"),
        (world != local_world, "ranks on more than one host"),
        (not peer, "no peer access between the GPUs"),
    ]
    why_not_ipc = [why for bad, why in why_not_ipc if bad]
    notes = []
    if not nccl:
        notes.append(
            f"{local_world} ranks share {gpus} GPU(s): NCCL refuses two ranks on one GPU, so no "
            "NCCL baseline (speed-ups '-') and no NCCL transport; the cross-GPU part needs 2+ "
            "GPUs, one per rank"
        )
        notes.append(
            "ranks that share a GPU run by time-slicing: these times are not a multi-GPU run's"
        )
    if "ipc" in transports and why_not_ipc:
        notes.append(f"no CUDA-IPC transport: {', '.join(why_not_ipc)}")
    ok = {"nccl": nccl, "ipc": not why_not_ipc}
    return CudaPlan(gpus, world, local_world, nccl, [t for t in transports if ok[t]], notes)


def agreed_plan(opts, world: int, gloo) -> CudaPlan:
    """cuda_plan of the fewest GPUs and the most ranks any host has (LOCAL_WORLD_SIZE, torchrun's),
    and of peer access among the GPUs every host's ranks use, agreed over the Gloo group, so that
    every rank makes the same groups."""
    import torch
    import torch.distributed as dist

    gpus = torch.cuda.device_count()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    used = sorted({r % gpus for r in range(local)})
    peer = all(torch.cuda.can_device_access_peer(a, b) for a in used for b in used if a != b)
    facts = torch.tensor([-gpus, local, int(not peer)], dtype=torch.int64)
    dist.all_reduce(facts, op=dist.ReduceOp.MAX, group=gloo)
    return cuda_plan(-int(facts[0]), world, int(facts[1]), opts.transports, not int(facts[2]))


def prediction(algorithm, bits, count, opts, world, link, costs):
    """(serial, overlapped) microseconds that benchmarks/cost_model.py predicts for one row on
    `world` GPUs over `link`, or None where it has no model: the exact NCCL allreduce in the input
    dtype (its ring), and qnccl's algorithms where both phases quantize (the transport does not
    enter the model; `algorithm` may carry it, ``two_step@ipc``). The codec knobs are opts'."""
    import cost_model as cm

    algo = algorithm.split("@")[0]
    if algo == BASELINES["cuda"]:
        if bits != opts.dtype:  # the bf16 row with its casts: not modelled
            return None
        p = cm.nccl_ring(count, qbench.ELEM_BYTES[opts.dtype], world, link, costs)
        return p.serial_us, p.overlap_us
    rs, ag = (None if b == "none" else int(b) for b in bits.split("/"))
    if algo not in cm.ALGORITHMS or rs is None or ag is None:
        return None
    cfg = qbench.make_config(opts, algo, rs, ag)
    p = cm.predict(
        algo, count, world, link, costs, rs, ag, cfg.group_size, cfg.symmetric, cfg.microshards
    )
    return p.serial_us, p.overlap_us


# ---------------------------------------------------------------------------------------------
# progress


def _clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}:{seconds % 60:02d}"


class Progress:
    """Counts finished configurations (per_size of them at each size); estimates the time left
    from the work done so far, each configuration weighted by its calls x max(size, 1 MiB) (small
    messages cost per-call latency)."""

    def __init__(self, opts, per_size: int):
        self.start = time.perf_counter()
        self.weights = []
        for size in opts.sizes:
            w = (opts.warmup + iters_for(opts, size)) * max(size, 1 << 20)
            self.weights += [w] * per_size
        self.total = len(self.weights)
        self.done = 0
        self.done_weight = 0.0

    def step(self, what: str) -> None:
        self.done_weight += self.weights[self.done]
        self.done += 1
        elapsed = time.perf_counter() - self.start
        left = sum(self.weights[self.done :])
        eta = elapsed * left / self.done_weight if self.done_weight else 0.0
        print(
            f"[{self.done}/{self.total}] {what} | elapsed {_clock(elapsed)}, ETA {_clock(eta)}",
            file=sys.stderr,
            flush=True,
        )


# ---------------------------------------------------------------------------------------------
# the ranks


def sweep_rank(rank: int, world: int, opts, gloo=None, plan=None) -> list:
    """Run the sweep on this rank. Call it on every rank of an initialised default process group
    whose backend is qnccl (imported qcomm; the group's config is replaced as the sweep goes).
    gloo: a Gloo group over the same ranks for the baseline, barriers and checks (made if None).
    plan: with opts.device "cuda", the CudaPlan (agreed_plan's if None); the current CUDA device
    is this rank's. Returns the rows (dicts) on rank 0, [] on the other ranks; rank 0 also writes
    opts.csv as rows finish and prints progress on stderr."""
    import torch.distributed as dist

    if gloo is None:
        gloo = dist.new_group(backend="gloo")
    if opts.device == "cuda" and plan is None:
        plan = agreed_plan(opts, world, gloo)
    sweep = _Sweep(rank, world, opts, gloo, plan)
    try:
        for size in opts.sizes:
            sweep.run_size(size)
    finally:
        sweep.close()
    return sweep.rows


class _Sweep:
    """One rank's state: the groups, the runner, rank 0's CSV writer, progress and rows."""

    def __init__(self, rank, world, opts, gloo, plan):
        import torch
        import torch.distributed as dist

        self.rank, self.world, self.opts, self.gloo, self.plan = rank, world, opts, gloo, plan
        self.lead = rank == 0
        self.cuda = opts.device == "cuda"
        self.base_name = BASELINES[opts.device]
        if self.cuda:
            self.device = torch.device("cuda", torch.cuda.current_device())
            # the exact baseline: NCCL, where every rank has a GPU of its own
            self.base_group = dist.new_group(backend="nccl") if plan.nccl else None
            self.groups = self._transport_groups()
        else:
            self.device = torch.device("cpu")
            self.base_group = gloo
            self.groups = [("", None)]  # the default group, over Gloo
        self.runner = qbench.Runner(rank, world, gloo)
        self.link = self.costs = None
        if self.lead and opts.predict and self.cuda and not plan.shared:
            import cost_model as cm

            self.link = cm.parse_links(opts.predict, 3.0)[0]
            self.costs = cm.KernelCosts.from_csv(opts.kernel_csv)
        bases = 0 if self.base_group is None else 1 + int(with_bf16_baseline(opts))
        per_size = len(opts.algorithms) * len(opts.bits) * len(self.groups) + bases
        self.progress = Progress(opts, per_size) if self.lead else None
        self.rows = []
        fields = COLUMNS + ["allreduce_only_us"] + (PRED_COLUMNS if self.costs is not None else [])
        self.csv = qbench.CsvLog(opts.csv if self.lead else None, fields, extrasaction="ignore")

    def _transport_groups(self) -> list:
        """[(transport, qnccl group)] for each transport of the plan: QCOMM_TRANSPORT set to it for
        the group's first quantized CUDA allreduce (made here, on every rank), which chooses."""
        import torch
        import torch.distributed as dist

        import qcomm

        cfg = qbench.make_config(self.opts, "two_step", 8, 8)
        saved = os.environ.get("QCOMM_TRANSPORT")
        groups = []
        try:
            for transport in self.plan.transports:
                os.environ["QCOMM_TRANSPORT"] = transport
                group = dist.new_group(backend=qcomm.BACKEND, pg_options=cfg)
                x = torch.ones(1 << 16, device=self.device)
                dist.all_reduce(x, group=group)
                torch.cuda.synchronize()
                got = qcomm.cuda_transport(group)
                if got["transport"] != transport:
                    raise RuntimeError(f"QCOMM_TRANSPORT={transport}, but the group chose {got}")
                groups.append((transport, group))
        finally:
            if saved is None:
                os.environ.pop("QCOMM_TRANSPORT", None)
            else:
                os.environ["QCOMM_TRANSPORT"] = saved
        return groups

    def close(self):
        self.csv.close()

    def _mark(self):
        """A point in time: the host clock (CPU), or an event recorded on the current stream."""
        if not self.cuda:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _seconds(self, start, end) -> float:
        if not self.cuda:
            return end - start
        end.synchronize()
        return start.elapsed_time(end) * 1e-3

    def _measure(self, ctx, group, half=None):
        """The runner's warmup + iters allreduces of ctx's input on `group` (through `half`: cast to
        it, the allreduce of that, cast back), each call timed by _mark; returns (the timed calls'
        seconds, max over ranks; the allreduce alone's, with `half`; calls that differed across
        ranks)."""
        import torch.distributed as dist

        whole, alone = [], []

        def call(b):
            t0 = self._mark()
            if half is None:
                dist.all_reduce(b, group=group)
            else:
                half.copy_(b)
                a0 = self._mark()
                dist.all_reduce(half, group=group)
                a1 = self._mark()
                b.copy_(half)
            t1 = self._mark()
            whole.append(self._seconds(t0, t1))
            if half is not None:
                alone.append(self._seconds(a0, a1))

        opts = self.opts
        _, mism, _ = self.runner.run(
            ctx["inp"], ctx["buf"], ctx["scratch"], group, opts.warmup, ctx["iters"], call=call
        )
        return self._max_over_ranks(whole), self._max_over_ranks(alone), mism

    def _max_over_ranks(self, seconds: list) -> list:
        """The timed calls' (after the warm-up) slowest rank's seconds."""
        return qbench.slowest(seconds[self.opts.warmup :], self.gloo)

    def run_size(self, size: int) -> None:
        import torch
        import torch.distributed as dist

        import qcomm

        opts, world = self.opts, self.world
        dtype = getattr(torch, qbench.DTYPES[opts.dtype])
        count = size // qbench.ELEM_BYTES[opts.dtype]
        iters = iters_for(opts, size)
        calls = opts.warmup + iters
        bus = 2 * (world - 1) / world
        inp = qbench.make_input(opts.seed, self.rank, count, dtype).to(self.device)
        buf = torch.empty_like(inp)
        scratch = torch.empty_like(buf.view(torch.uint8))
        exact = None
        if self.lead:  # the float64 sum of every rank's input, regenerated from the seeds
            exact = inp.double()
            for r in range(1, world):
                exact += qbench.make_input(opts.seed, r, count, dtype).to(self.device).double()
        dist.barrier(group=self.gloo)
        ctx = dict(size=size, count=count, iters=iters, inp=inp, buf=buf, scratch=scratch)
        ctx["exact"] = exact
        base = {}
        done = []
        if self.base_group is not None:
            # baseline 1: the exact allreduce in the input dtype
            times, _, mism = self._measure(ctx, self.base_group)
            exact_row = self._row(ctx, self.base_name, opts.dtype, times, mism, int(bus * size))
            if self.lead:
                base["exact"] = exact_row["time_us"]
            done.append(exact_row)

        # baseline 2: cast to bf16, the exact allreduce, cast back (the allreduce alone timed too)
        if self.base_group is not None and with_bf16_baseline(opts):
            half = torch.empty(count, dtype=torch.bfloat16, device=self.device)
            times, alone, mism = self._measure(ctx, self.base_group, half)
            row = self._row(ctx, self.base_name, "bf16", times, mism, int(bus * count * 2))
            if self.lead:
                row["allreduce_only_us"] = statistics.median(alone) * 1e6
                base["bf16"] = row["time_us"]
            done.append(row)
            del half
        for row in done:
            self._finish(row, base)

        # the quantized allreduces, over each transport's group (CPU: the default group)
        for transport, group in self.groups:
            for algo in opts.algorithms:
                for rs, ag in opts.bits:
                    qcomm.set_config(qbench.make_config(opts, algo, rs, ag), group=group)
                    before = qcomm.stats(group)
                    times, _, mism = self._measure(ctx, group)
                    after = qcomm.stats(group)
                    wire = (after["wire_bytes"] - before["wire_bytes"]) // calls
                    quantized = after["quantized_calls"] - before["quantized_calls"]
                    label = f"{algo}@{transport}" if transport else algo
                    row = self._row(ctx, label, qbench.bits_label((rs, ag)), times, mism, wire)
                    note = "" if quantized == calls else f"; only {quantized}/{calls} quantized"
                    self._finish(row, base, note)

    def _row(self, ctx, algorithm, bits, times, mism, wire):
        """The row of one measurement (rank 0; None elsewhere), errors from ctx's buf."""
        if not self.lead:
            return None
        t_us = statistics.median(times) * 1e6
        rel, mx = qbench.errors(ctx["buf"], ctx["exact"])
        algbw = ctx["size"] / (t_us * 1e-6) / 1e9
        row = dict(
            size=ctx["size"],
            count=ctx["count"],
            dtype=self.opts.dtype,
            algorithm=algorithm,
            bits=bits,
            iters=ctx["iters"],
            time_us=t_us,
            min_us=min(times) * 1e6,
            max_us=max(times) * 1e6,
            algbw=algbw,
            busbw=algbw * 2 * (self.world - 1) / self.world,
            wire_bytes=wire,
            rel_err=rel,
            max_abs_err=mx,
            identical=not mism,
            allreduce_only_us=None,
        )
        if self.costs is not None:
            pred = prediction(
                algorithm, bits, ctx["count"], self.opts, self.world, self.link, self.costs
            )
            row.update(zip(PRED_COLUMNS, pred or (None, None)))
        return row

    def _finish(self, row, base, note=""):
        if not self.lead:
            return
        row["speedup_exact"] = base["exact"] / row["time_us"] if "exact" in base else None
        row["speedup_bf16"] = base["bf16"] / row["time_us"] if "bf16" in base else None
        self.rows.append(row)
        self.csv.add(format_row(row, csv_form=True))
        name = BASELINE_NAMES[self.base_name]
        sp = []
        if row["speedup_exact"] is not None:
            sp.append(f"x{row['speedup_exact']:.2f} vs {name} {self.opts.dtype}")
        if row["speedup_bf16"] is not None:
            sp.append(f"x{row['speedup_bf16']:.2f} vs {name} bf16")
        sp = f" ({', '.join(sp)})" if sp else ""
        self.progress.step(
            f"{qbench.size_label(row['size'])} {row['algorithm']} {row['bits']}: "
            f"{row['time_us']:.1f} us{sp}, rel_err {row['rel_err']:.2e}, "
            f"identical {'yes' if row['identical'] else 'NO'}{note}"
        )


# ---------------------------------------------------------------------------------------------
# output


def _is_base(row: dict) -> bool:
    return row["algorithm"] in BASELINE_NAMES


def _base_name(rows: list) -> str:
    """'Gloo' or 'NCCL': the baseline of these rows (NCCL where qnccl rows name a CUDA transport,
    so also where no baseline ran)."""
    cuda = any("@" in r["algorithm"] or r["algorithm"] == BASELINES["cuda"] for r in rows)
    return BASELINE_NAMES[BASELINES["cuda" if cuda else "cpu"]]


def format_row(row: dict, csv_form: bool = False) -> dict:
    def opt(v, fmt):
        return "" if v is None else format(v, fmt)

    out = {
        "size": str(row["size"]),
        "count": str(row["count"]),
        "dtype": row["dtype"],
        "algorithm": row["algorithm"],
        "bits": row["bits"],
        "iters": str(row["iters"]),
        "time_us": f"{row['time_us']:.1f}",
        "min_us": f"{row['min_us']:.1f}",
        "max_us": f"{row['max_us']:.1f}",
        "algbw": f"{row['algbw']:.3f}",
        "busbw": f"{row['busbw']:.3f}",
        "wire_bytes": str(row["wire_bytes"]),
        "speedup_exact": opt(row["speedup_exact"], ".3f"),
        "speedup_bf16": opt(row["speedup_bf16"], ".3f"),
        "rel_err": f"{row['rel_err']:.3e}",
        "max_abs_err": f"{row['max_abs_err']:.3e}",
        "identical": "yes" if row["identical"] else "no",
    }
    for c in PRED_COLUMNS:
        out[c] = opt(row.get(c), ".1f")
    if csv_form:
        out["allreduce_only_us"] = opt(row.get("allreduce_only_us"), ".1f")
    else:  # no value: "-" in the table
        out = {k: v or "-" for k, v in out.items()}
    return out


def format_table(rows: list) -> str:
    columns = COLUMNS + (PRED_COLUMNS if any(r.get(PRED_COLUMNS[0]) for r in rows) else [])
    lines = [[format_row(r)[c] for c in columns] for r in rows]
    # an empty line between sizes
    breaks = {i for i in range(1, len(rows)) if rows[i]["size"] != rows[i - 1]["size"]}
    return qbench.align_table(columns, lines, _LEFT, breaks)


def header_lines(opts, plan=None) -> list:
    cfg = qbench.make_config(opts, opts.algorithms[0], *opts.bits[0])
    iters = f"iters={opts.iters}"
    other = []
    if any(iters_for(opts, s) != opts.iters for s in opts.sizes if s < opts.small_size):
        other.append(
            f"{iters_for(opts, 1)} below {qbench.size_label(opts.small_size)}, where calls are "
            "cheap and noisy"
        )
    if any(iters_for(opts, s) < opts.iters for s in opts.sizes if s >= opts.large_size):
        other.append(
            f"{opts.large_iters} from {qbench.size_label(opts.large_size)} on, to keep the run "
            "short"
        )
    if other:
        iters += " (" + "; ".join(other) + ")"
    base = BASELINES[opts.device]
    name = BASELINE_NAMES[base]
    lines = [
        f"# allreduce_sweep: qnccl quantized allreduce vs {name} exact allreduce "
        f"({opts.dtype} and bf16), "
        + (
            "local CPU ranks over loopback"
            if plan is None
            else f"torchrun ranks on CUDA, {plan.local_world} a host, {plan.gpus} GPUs a host"
        ),
        *qbench.system_lines(),
    ]
    if plan is not None:
        import torch

        lines.append(
            f"# GPU: {torch.cuda.get_device_name()}, torch CUDA {torch.version.cuda}; "
            f"transports: {', '.join(plan.transports)}"
        )
    lines += [
        "# load average at start " + qbench.load_average(),
        f"# world={opts.world} dtype={opts.dtype} threads/rank={opts.threads} {iters} "
        f"warmup={opts.warmup} group_size={cfg.group_size} symmetric={cfg.symmetric} "
        f"microshards={cfg.microshards} min_bytes=0 seed={opts.seed}",
        "# time_us: median over iters of the max over ranks "
        + ("" if plan is None else "of CUDA events around the call ")
        + "(min_us/max_us: spread); "
        f"algbw=size/time GB/s; busbw=algbw*2*(W-1)/W; speedup_X = {base} X time / this time",
        f"# {base} bf16 = cast to bf16 + {name} allreduce + cast back (its time includes the "
        f"casts); wire_bytes of the {base} rows: nominal ring volume; errors vs the float64 sum",
    ]
    if plan is not None:
        lines += [f"# note: {n}" for n in plan.notes]
    if opts.predict:
        if plan is None or plan.shared:
            lines.append("# no predictions: the cost model is of ranks on GPUs of their own")
        else:
            lines.append(
                f"# pred_serial_us, pred_overlap_us: PREDICTED by benchmarks/cost_model.py for "
                f"{opts.world} GPUs over {opts.predict} from {opts.kernel_csv}, not measured"
            )
    return lines


def footer_lines(rows: list) -> list:
    out = []
    for r in rows:
        if _is_base(r) and r.get("allreduce_only_us") is not None:
            casts = r["time_us"] - r["allreduce_only_us"]
            out.append(
                f"#   {qbench.size_label(r['size'])}: {r['algorithm']} bf16 {r['time_us']:.1f} us "
                f"= allreduce {r['allreduce_only_us']:.1f} us + casts {casts:.1f} us"
            )
    if out:
        out.insert(0, "# the bf16 baseline without its casts (median of the allreduce alone):")
    if rows and _base_name(rows) == "NCCL" and not any(_is_base(r) for r in rows):
        out.append(
            "# no NCCL baseline, so no speed-up ('-'): the cross-GPU comparison needs 2+ GPUs, "
            "one per rank (NCCL refuses two ranks on one GPU)"
        )
    return out


# ---------------------------------------------------------------------------------------------
# plots


def _size_ticks(ax, sizes):
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([qbench.size_label(s) for s in sizes])
    ax.minorticks_off()


def plot(rows: list, opts, out_dir: str) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    quant = [r for r in rows if not _is_base(r)]
    sizes = sorted({r["size"] for r in rows})
    algos = list(dict.fromkeys(r["algorithm"] for r in quant))
    bits = list(dict.fromkeys(r["bits"] for r in quant))
    colors = {a: f"C{i}" for i, a in enumerate(algos)}
    styles = ["-", "--", ":", "-."]
    markers = ["o", "s", "^", "D", "v"]
    style = {b: (styles[i % len(styles)], markers[i % len(markers)]) for i, b in enumerate(bits)}
    base = _base_name(rows)
    r0 = rows[0] if rows else None  # the ranks, from busbw / algbw = 2(W-1)/W
    world = round(2 / (2 - r0["busbw"] / r0["algbw"])) if r0 and r0["algbw"] else opts.world
    if base == "Gloo":
        title = f"{world} CPU ranks, loopback, {opts.dtype}"
    else:
        title = f"{world} ranks on CUDA, {opts.dtype}"
    paths = []

    # (a) speedup vs message size (not without a baseline)
    noisy = sorted(
        r["size"]
        for r in rows
        if _is_base(r) and r["bits"] == opts.dtype and r["max_us"] > NOISY * r["min_us"]
    )
    panels = []
    if any(r["speedup_exact"] is not None for r in quant):
        panels.append(("speedup_exact", f"{base} {opts.dtype}"))
    if any(r["speedup_bf16"] is not None for r in quant):
        panels.append(("speedup_bf16", f"{base} bf16 (incl. casts)"))
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
        for ax, (key, name) in zip(axes[0], panels):
            for a in algos:
                for b in bits:
                    pts = sorted(
                        (r["size"], r[key]) for r in quant if r["algorithm"] == a and r["bits"] == b
                    )
                    if pts:
                        ls, mk = style[b]
                        ax.plot(*zip(*pts), ls, marker=mk, color=colors[a], label=f"{a} {b}", ms=4)
            ax.axhline(1.0, color="k", lw=0.8)
            for i, size in enumerate(noisy):  # shade the sizes whose timings are mostly noise
                j = sizes.index(size)
                lo = (sizes[j - 1] * size) ** 0.5 if j > 0 else size / 2
                hi = (sizes[j + 1] * size) ** 0.5 if j + 1 < len(sizes) else size * 2
                label = f"{base} {opts.dtype} max/min > {NOISY}x (noisy)" if i == 0 else None
                ax.axvspan(lo, hi, color="0.88", lw=0, zorder=0, label=label)
            _size_ticks(ax, sizes)
            ax.set_yscale("log", base=2)
            ax.set_xlabel("message size (bytes)")
            ax.set_ylabel(f"speedup vs {name} (time ratio)")
            ax.set_title(f"speedup vs {name}")
            ax.grid(True, which="major", alpha=0.3)
        axes[0][-1].legend(fontsize=7, ncol=1, loc="best")
        fig.suptitle(f"qnccl quantized allreduce: speedup vs message size ({title})")
        fig.tight_layout()
        paths.append(os.path.join(out_dir, "speedup_vs_size.png"))
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)

    # (b) relative error vs bits (median over sizes, bars: min..max over sizes)
    def wire_bits(label):
        return sum(int(x) if x.isdigit() else 32 for x in label.split("/"))

    order = sorted(bits, key=wire_bits)
    fig, ax = plt.subplots(figsize=(6.5, 4.8))
    for i, a in enumerate(algos):
        xs, med, lo, hi = [], [], [], []
        for j, b in enumerate(order):
            errs = [r["rel_err"] for r in quant if r["algorithm"] == a and r["bits"] == b]
            if not errs:
                continue
            m = statistics.median(errs)
            xs.append(j + (i - (len(algos) - 1) / 2) * 0.06)
            med.append(m)
            lo.append(m - min(errs))
            hi.append(max(errs) - m)
        ax.errorbar(xs, med, yerr=[lo, hi], marker="o", color=colors[a], label=a, capsize=3)
    lowest = min((r["rel_err"] for r in quant if r["rel_err"] > 0), default=0.0)
    off_scale = []
    for r_bits, ls in dict([("bf16", "--"), (opts.dtype, ":")]).items():
        errs = [r["rel_err"] for r in rows if _is_base(r) and r["bits"] == r_bits]
        errs = [e for e in errs if e > 0]
        if not errs:
            continue
        m = statistics.median(errs)
        if lowest and m < lowest / 1000:  # would squash the quantized errors: name it instead
            off_scale.append(f"{base} {r_bits}: {m:.1e}, off scale")
            continue
        ax.axhline(m, color="k", ls=ls, lw=0.9, label=f"{base} {r_bits} ({m:.1e})")
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels([f"{b} bits" for b in order])
    ax.set_yscale("log")
    ax.set_xlabel("rs/ag bits")
    ax.set_ylabel("relative L2 error vs float64 sum")
    note = "; ".join(["median over sizes, bars min..max"] + off_scale)
    ax.set_title(f"relative error vs bits ({title};\n{note})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "rel_err_vs_bits.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    # (c) latency curves, and the cost model's predictions (serial) dotted where there are some
    def curve(ax, sel, fmt, key="time_us", **kw):
        pts = sorted((r["size"], r[key]) for r in rows if sel(r) and r.get(key) is not None)
        if pts:
            ax.plot(*zip(*pts), fmt, **kw)

    fig, ax = plt.subplots(figsize=(7.5, 5))
    pred = PRED_COLUMNS[0]
    for r_bits, ls in dict([("bf16", "--"), (opts.dtype, "-")]).items():

        def sel(r, r_bits=r_bits):
            return _is_base(r) and r["bits"] == r_bits

        curve(ax, sel, ls, color="k", lw=2, label=f"{base} {r_bits}")
        curve(ax, sel, ":", pred, color="k", lw=1, label=f"{base} {r_bits} predicted")
        if r_bits == opts.dtype:  # the spread of the first baseline: how noisy a size is
            band = sorted((r["size"], r["min_us"], r["max_us"]) for r in rows if sel(r))
            if band:
                xs, lo, hi = zip(*band)
                ax.fill_between(
                    xs, lo, hi, color="k", alpha=0.1, lw=0, label=f"{base} {r_bits} min..max"
                )
    for a in algos:
        for b in bits:

            def sel(r, a=a, b=b):
                return not _is_base(r) and r["algorithm"] == a and r["bits"] == b

            ls, mk = style[b]
            curve(ax, sel, ls, marker=mk, color=colors[a], label=f"{a} {b}", ms=4)
            curve(ax, sel, ":", pred, color=colors[a], lw=1, label=f"{a} {b} predicted")
    _size_ticks(ax, sizes)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("time (us, median, max over ranks)")
    ax.set_title(f"allreduce latency ({title})")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    paths.append(os.path.join(out_dir, "time_vs_size.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def read_csv(path: str) -> list:
    """The rows of a CSV written by this script, with their types back."""
    ints = {"size", "count", "iters", "wire_bytes"}
    text = {"dtype", "algorithm", "bits", "identical"}
    rows = []
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            row = {}
            for k, v in rec.items():
                if k in text:
                    row[k] = v
                elif v == "":
                    row[k] = None
                else:
                    row[k] = int(v) if k in ints else float(v)
            row["identical"] = rec["identical"] == "yes"
            rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# the parent


def _launched():
    """(rank, world) of a torchrun launch (RANK and WORLD_SIZE set), else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def _plots(rows: list, opts) -> None:
    if not opts.plot_dir:
        return
    try:
        for path in plot(rows, opts, opts.plot_dir):
            print(f"# plot: {path}")
    except ImportError as e:  # a GPU host's python may lack matplotlib
        print(f"# no plots: {e}")


def report(rows: list, opts, elapsed: float) -> int:
    """Rank 0's end of a run: the table, the footer, the CSV's path and the plots; 1 when some
    output was not bit-identical across ranks, else 0."""
    print(format_table(rows), flush=True)
    for line in footer_lines(rows):
        print(line)
    if opts.csv:
        print(f"# csv: {opts.csv}")
    _plots(rows, opts)
    ok = all(r["identical"] for r in rows)
    if not ok:
        print("# FAIL: some outputs were not bit-identical across ranks")
    load = qbench.load_average()
    print(f"# {len(rows)} rows in {_clock(elapsed)} (m:ss); load average at the end {load}")
    return 0 if ok else 1


def _run_torchrun(parser, opts, rank: int, world: int) -> int:
    """This rank of a torchrun launch: the default qnccl group from torchrun's env://, the sweep;
    every rank returns rank 0's status."""
    import torch
    import torch.distributed as dist

    import qcomm

    torch.set_num_threads(opts.threads)
    if opts.device == "cuda":
        if not (torch.cuda.is_available() and qcomm.compiled_with_cuda()):
            parser.error("--device cuda needs a CUDA device and qcomm's CUDA build")
        os.environ["QCOMM_CUDA_QUANTIZE"] = "1"  # the quantized CUDA path is opt-in
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group(
        qcomm.BACKEND,
        timeout=datetime.timedelta(seconds=opts.timeout),
        pg_options=qbench.make_config(opts, opts.algorithms[0], *opts.bits[0]),
    )
    gloo = dist.new_group(backend="gloo")
    plan = agreed_plan(opts, world, gloo) if opts.device == "cuda" else None
    if plan is not None and not plan.transports:
        if rank == 0:
            print("; ".join(plan.notes), file=sys.stderr)
        dist.destroy_process_group()
        return 2
    if rank == 0:
        print("\n".join(header_lines(opts, plan)), flush=True)
    t0 = time.perf_counter()
    rows = sweep_rank(rank, world, opts, gloo, plan)
    status = torch.tensor([report(rows, opts, time.perf_counter() - t0) if rank == 0 else 0])
    dist.broadcast(status, src=0, group=gloo)
    dist.destroy_process_group()
    return int(status[0])


def main(argv=None) -> int:
    parser = build_parser()
    opts = parser.parse_args(argv)
    launch = _launched()
    if launch is not None and not opts.from_csv:
        opts.world = launch[1]
    check_args(parser, opts)

    if opts.from_csv:
        rows = read_csv(opts.from_csv)
        if rows:  # the plots' titles name the dtype (from the rows)
            opts.dtype = rows[0]["dtype"]
        print(f"# rows of {opts.from_csv}")
        print(format_table(rows))
        for line in footer_lines(rows):
            print(line)
        _plots(rows, opts)
        return 0
    if launch is not None:
        return _run_torchrun(parser, opts, *launch)
    if opts.device == "cuda":
        parser.error(
            "--device cuda runs under torchrun: torchrun --standalone --nproc_per_node=GPUS "
            "benchmarks/allreduce_sweep.py --device cuda ..."
        )

    import qcomm

    print("\n".join(header_lines(opts)), flush=True)
    t0 = time.perf_counter()
    results = qbench.run_ranks(
        sweep_rank,
        opts.world,
        opts,
        backend=qcomm.BACKEND,
        pg_options=qbench.make_config(opts, opts.algorithms[0], *opts.bits[0]),
        timeout=opts.timeout,
        threads=opts.threads,
        env={"OMP_NUM_THREADS": str(opts.threads)},
    )
    return report(results[0], opts, time.perf_counter() - t0)


if __name__ == "__main__":
    sys.exit(main())
