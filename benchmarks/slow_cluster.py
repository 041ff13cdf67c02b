"""A bandwidth-limited CPU cluster on one machine: N ranks, each in its own network namespace.

Topology: namespaces qcomm-r0 .. qcomm-r{N-1} and a switch namespace qcomm-sw holding a bridge.
Each rank reaches the bridge through a veth pair; a `tc tbf` rate limit on both ends of each pair
limits the rank's upload and download to --rate (optional --delay adds netem latency). Addresses
10.77.0.1.. live only inside these namespaces. Gloo is bound to each rank's veth
(GLOO_SOCKET_IFNAME). Everything is removed at the end, also on failure or Ctrl-C.

Each rank runs, for each --size: Gloo's exact allreduce in fp32 and in bf16, then the quantized
allreduce for each --algorithms x --bits, every one --iters times (median, and min/max for spread);
with --interleave, Gloo's two and every configuration once per round, round after round.
Rank 0 prints a table with ratios measured side by side in this one run, and writes --csv. With
--isas generic,avx512 (say) every quantized configuration runs once with each instruction set of
the CPU codec loops (qcomm._C._testing.set_cpu_isa on every rank), labelled "algorithm [isa]".

--collective reduce_scatter (or all_gather) times that collective instead, Gloo's against qnccl's
(QuantConfig(reduce_scatter=True, all_gather=True)); a size is then the message: the
reduce-scatter's input, the all-gather's output (each rank's shard is 1/W of it).

Needs root (ip netns, tc). Example, the setting of issue 4:
    sudo .venv/bin/python benchmarks/slow_cluster.py --world 2 --rate 1gbit --sizes 64M
    sudo .venv/bin/python benchmarks/slow_cluster.py --collective reduce_scatter --bits 8/8
--local runs the ranks on this host over loopback instead, with no namespace or rate limit and no
root: a smoke test that the script runs, not a measurement.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFIX = "qcomm"
SUBNET = "10.77.0"


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def ns_names(world: int):
    return [f"{PREFIX}-r{i}" for i in range(world)], f"{PREFIX}-sw"


def teardown(world: int) -> None:
    ranks, sw = ns_names(max(world, 8))
    for ns in ranks + [sw]:
        sh("ip", "netns", "del", ns, check=False)  # deleting a namespace removes its veths


def setup(world: int, rate: str, delay: str | None) -> None:
    ranks, sw = ns_names(world)
    sh("ip", "netns", "add", sw)
    sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", sw, "link", "set", "br0", "up")
    sh("ip", "-n", sw, "link", "set", "lo", "up")
    for i, ns in enumerate(ranks):
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        # create the pair inside the rank's namespace, then move the switch end
        sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}")
        sh("ip", "-n", ns, "link", "set", f"p{i}", "netns", sw)
        sh("ip", "-n", ns, "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", sw, "link", "set", f"p{i}", "master", "br0")
        sh("ip", "-n", sw, "link", "set", f"p{i}", "up")
        for where, dev in ((ns, "eth0"), (sw, f"p{i}")) if rate != "none" else ():
            # tbf: rate with a burst of a few ms of traffic, latency bounds the queue
            args = ["tc", "-n", where, "qdisc", "add", "dev", dev, "root"]
            if delay:
                sh(*args, "handle", "1:", "netem", "delay", delay)
                args = ["tc", "-n", where, "qdisc", "add", "dev", dev, "parent", "1:1"]
            sh(*args, "tbf", "rate", rate, "burst", "256kb", "latency", "50ms")


# ---- the per-rank worker (runs inside a namespace) ----


def _parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("B")
    return int(float(t[:-1]) * units[t[-1]]) if t[-1] in units else int(t)


def collective(name: str, x, group=None) -> None:
    """One `name` collective ("all_reduce", "reduce_scatter", "all_gather") of the message x on
    `group` (x: the allreduce's tensor, the reduce-scatter's input, or the all-gather's output,
    whose own shard is the input)."""
    import torch
    import torch.distributed as dist

    w = dist.get_world_size(group)
    if name == "all_reduce":
        dist.all_reduce(x, group=group)
    elif name == "reduce_scatter":
        out = torch.empty(x.numel() // w, dtype=x.dtype)
        dist.reduce_scatter_tensor(out, x, group=group)
    else:
        n = x.numel() // w
        out = torch.empty(n * w, dtype=x.dtype)
        dist.all_gather_into_tensor(out, x[:n], group=group)


def join(args, backend: str = "gloo", pg_options=None):
    """In a rank's namespace: --threads torch threads, the default group of `backend` through
    rank 0's address, and a separate Gloo group for the script's barriers and timings (never a
    group being timed), which it returns."""
    import torch
    import torch.distributed as dist

    sys.path.insert(0, ROOT)
    import qcomm  # noqa: F401  (registers qnccl)

    torch.set_num_threads(args.threads)
    # rank 0's address in the namespaces; a script's --rate loopback runs its ranks on this host
    # over 127.0.0.1 instead (run_local)
    master = getattr(args, "master", None) or f"{SUBNET}.1"
    dist.init_process_group(
        backend,
        init_method=f"tcp://{master}:{args.port}",
        rank=args.rank,
        world_size=args.world,
        pg_options=pg_options,
    )
    return dist.new_group(backend="gloo")


def worker(args) -> int:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, ROOT)
    import qcomm

    rank = args.rank
    gloo = join(args, "qnccl", qcomm.QuantConfig(min_bytes=0))
    rows = []

    def timed(fn, make):
        times = []
        for _ in range(args.warmup + args.iters):
            t = make()
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            fn(t)
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=gloo)
            times.append(float(dt))
        times = times[args.warmup :]
        return statistics.median(times), min(times), max(times)

    what_call = args.collective
    for size in [_parse_size(s) for s in args.sizes.split(",")]:
        n = size // 4 // args.world * args.world  # whole shards
        x = torch.randn(n, generator=torch.Generator().manual_seed(rank))
        base = {}
        baselines = (("gloo_fp32", torch.float32), ("gloo_bf16", torch.bfloat16))
        base_samples = {name: [] for name, _ in baselines}
        if not args.interleave:
            for name, dtype in baselines:
                med, lo, hi = timed(
                    lambda t: collective(what_call, t, gloo), lambda x=x, dtype=dtype: x.to(dtype)
                )
                base_samples[name] = None
                base[name] = med
                rows.append([size, name, "-", med, lo, hi, "", "", ""])
                if rank == 0:
                    print(f"[{size >> 20} MiB] {name}: {med:.3f} s", file=sys.stderr, flush=True)
        isas = args.isas.split(",") if args.isas else [qcomm._C.cpu_isa()]
        rotations = {"off": [False], "on": [True], "both": [False, True]}[args.rotate]
        configs = []
        shadows = [0, args.shadow] if args.shadow else [0]
        groups = [int(g) for g in args.groups.split(",")]
        pieces = [int(m) for m in args.microshards.split(",")]
        for algo, bits, group, isa, rot, shadow, ms in itertools.product(
            args.algorithms.split(","),
            args.bits.split(","),
            groups,
            isas,
            rotations,
            shadows,
            pieces,
        ):
            rs, ag = (None if b == "none" else int(b) for b in bits.split("/"))
            what = f"{algo} [{isa}]" if args.isas else algo
            if len(groups) > 1 or group != 128:
                what += f" g{group}"
            if len(pieces) > 1:
                what += f" m{ms}"
            if args.rotate == "both":
                what += " rotated" if rot else ""
            if shadow:
                what += f" shadow={shadow}"
            cfg = qcomm.QuantConfig(
                algorithm=algo,
                rs_bits=rs,
                ag_bits=ag,
                min_bytes=0,
                microshards=ms,
                group_size=group,
                rotate=rot,
                tune=False,
                shadow=shadow,
                reduce_scatter=True,
                all_gather=True,
            )
            configs.append((what, bits, isa, cfg))
        if args.off:
            # qnccl with the collective's option unset: an exact pass-through to Gloo
            off = (
                qcomm.QuantConfig(algorithm="none")
                if what_call == "all_reduce"
                else qcomm.QuantConfig(min_bytes=0, tune=False)
            )
            configs.append(("qnccl off", "-", qcomm._C.cpu_isa(), off))

        def one_config(x, isa, cfg, rounds):
            qcomm._C._testing.set_cpu_isa(isa)
            qcomm.set_config(cfg)
            before = qcomm.stats()["wire_bytes"]
            got = []
            for _ in range(rounds):
                t = x.clone()
                dist.barrier(group=gloo)
                t0 = time.perf_counter()
                collective(what_call, t)
                dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=gloo)
                got.append(float(dt))
            return got, (qcomm.stats()["wire_bytes"] - before) // rounds

        samples = {c[0] + c[1]: [] for c in configs}
        wires = {}
        if args.interleave:
            # every config once per round, round after round: drifts of a shared machine's load
            # reach every config alike
            # (Gloo's fp32 and bf16 baselines too, in the same rounds)
            for i in range(args.warmup + args.iters):
                for name, dtype in baselines:
                    t = x.to(dtype)
                    dist.barrier(group=gloo)
                    t0 = time.perf_counter()
                    collective(what_call, t, gloo)
                    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                    dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=gloo)
                    if i >= args.warmup:
                        base_samples[name].append(float(dt))
                for what, bits, isa, cfg in configs:
                    got, wires[what + bits] = one_config(x, isa, cfg, 1)
                    if i >= args.warmup:
                        samples[what + bits] += got
        else:
            for what, bits, isa, cfg in configs:
                got, wires[what + bits] = one_config(x, isa, cfg, args.warmup + args.iters)
                samples[what + bits] = got[args.warmup :]
        for name, _ in baselines:
            if base_samples[name]:
                times = base_samples[name]
                base[name] = statistics.median(times)
                rows.append([size, name, "-", base[name], min(times), max(times), "", "", ""])
                if rank == 0:
                    print(f"[{size >> 20} MiB] {name}: {base[name]:.3f} s", file=sys.stderr)
        for what, bits, _isa, _cfg in configs:
            times = samples[what + bits]
            med, lo, hi = statistics.median(times), min(times), max(times)
            rows.append(
                [
                    size,
                    what,
                    bits,
                    med,
                    lo,
                    hi,
                    base["gloo_fp32"] / med,
                    base["gloo_bf16"] / med,
                    wires[what + bits],
                ]
            )
            if rank == 0:
                print(
                    f"[{size >> 20} MiB] {what} {bits}: {med:.3f} s "
                    f"({base['gloo_fp32'] / med:.2f}x fp32, {base['gloo_bf16'] / med:.2f}x bf16)",
                    file=sys.stderr,
                    flush=True,
                )
    if rank == 0:
        head = [
            "bytes",
            "what",
            "bits",
            "median_s",
            "min_s",
            "max_s",
            "vs_fp32",
            "vs_bf16",
            "wire_bytes_per_rank",
        ]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            cells = [
                str(r[0]),
                r[1],
                r[2],
                f"{r[3]:.3f}",
                f"{r[4]:.3f}",
                f"{r[5]:.3f}",
                f"{r[6]:.2f}x" if r[6] != "" else "",
                f"{r[7]:.2f}x" if r[7] != "" else "",
                str(r[8]),
            ]
            print("| " + " | ".join(cells) + " |")
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(head)
                w.writerows(rows)
    dist.destroy_process_group()
    return 0


# ---- the orchestrator ----


def run_workers(script: str, world: int, rate: str, delay, argv, timeout: float) -> int:
    """Runs `script --worker --rank i <argv>` in rank i's namespace of a fresh cluster (torn down
    afterwards, also on failure or Ctrl-C), Gloo bound to the rank's veth; 0 when every rank
    exits 0. The scripts that time things over the emulated link (this one, ddp_slow_link.py,
    async_overlap.py, examples/diloco.py) all start their ranks here."""
    name = os.path.basename(script)
    if "--local" in argv:
        return run_local(script, world, argv, timeout)
    if os.geteuid() != 0:
        print(f"{name} needs root (ip netns, tc)", file=sys.stderr)
        return 2
    teardown(world)
    procs = []
    try:
        setup(world, rate, delay)
        ranks, _ = ns_names(world)
        for i, ns in enumerate(ranks):
            env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", PYTHONPATH=ROOT)
            cmd = ["ip", "netns", "exec", ns, sys.executable, os.path.abspath(script)]
            procs.append(
                subprocess.Popen(cmd + ["--worker", "--rank", str(i)] + list(argv), env=env)
            )
        deadline = time.monotonic() + timeout
        codes = [p.wait(timeout=max(1, deadline - time.monotonic())) for p in procs]
        return 0 if all(c == 0 for c in codes) else 1
    except subprocess.TimeoutExpired:
        print(f"{name}: ranks did not finish within {timeout} s", file=sys.stderr)
        return 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        teardown(world)


def run_local(script: str, world: int, argv, timeout: float) -> int:
    """Runs `script --worker --rank i --master 127.0.0.1 <argv>` for each rank on this host, no
    namespaces (no root needed), Gloo bound to the loopback interface; 0 when every rank exits
    0."""
    procs = []
    try:
        for i in range(world):
            env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", PYTHONPATH=ROOT)
            cmd = [sys.executable, os.path.abspath(script), "--worker", "--rank", str(i)]
            procs.append(subprocess.Popen(cmd + ["--master", "127.0.0.1"] + list(argv), env=env))
        deadline = time.monotonic() + timeout
        codes = [p.wait(timeout=max(1, deadline - time.monotonic())) for p in procs]
        return 0 if all(c == 0 for c in codes) else 1
    except subprocess.TimeoutExpired:
        print(
            f"{os.path.basename(script)}: ranks did not finish within {timeout} s", file=sys.stderr
        )
        return 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def add_cluster_args(ap, port: int, timeout: float, delay: bool = True) -> None:
    """The options every script over the emulated link takes: --world, --rate, (--delay),
    --threads, --port, --timeout, and the hidden --worker/--rank its ranks are started with."""
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument(
        "--rate",
        default="1gbit",
        help="tc rate each way per rank, e.g. 1gbit, 10gbit; none: no limit; loopback: no "
        "namespaces, the ranks on this host over 127.0.0.1 (no root needed)",
    )
    if delay:
        ap.add_argument("--delay", default=None, help="optional added latency, e.g. 100us")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--port", type=int, default=port)
    ap.add_argument("--timeout", type=float, default=timeout)
    ap.add_argument(
        "--local",
        action="store_true",
        help="as --rate loopback: ranks on this host over 127.0.0.1 (a smoke test, no root)",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--master", default=None, help=argparse.SUPPRESS)


def dispatch(ap, script: str, worker, before=None) -> int:
    """Parses the command line: a rank (--worker) runs worker(args); otherwise the cluster is set
    up and every rank started with the same options (after before(args), if given)."""
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if before is not None:
        before(args)
    if args.rate == "loopback":  # the ranks on this host over 127.0.0.1, no namespaces
        return run_local(script, args.world, sys.argv[1:], args.timeout)
    delay = getattr(args, "delay", None)
    return run_workers(script, args.world, args.rate, delay, sys.argv[1:], args.timeout)


def _header(args) -> None:
    print(
        f"# {args.world} ranks in network namespaces, {args.rate} each way"
        + (f", +{args.delay} delay" if args.delay else "")
        + f", {args.threads} thread(s) per rank, {os.cpu_count()} cores",
        flush=True,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_cluster_args(ap, port=29577, timeout=1800)
    ap.add_argument("--sizes", default="64M")
    ap.add_argument(
        "--collective",
        default="all_reduce",
        choices=("all_reduce", "reduce_scatter", "all_gather"),
        help="the collective timed (a size is its message: the RS input, the AG output)",
    )
    ap.add_argument("--algorithms", default="two_step,ring,semi_ring")
    ap.add_argument("--bits", default="8/8,4/8,4/4")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument(
        "--microshards",
        default="4",
        help="QuantConfig(microshards=...) to time, e.g. 1,4,16 (side by side, labelled m<N>)",
    )
    ap.add_argument(
        "--groups", default="128", help="QuantConfig(group_size=...) to time, e.g. 32,128"
    )
    ap.add_argument(
        "--rotate",
        nargs="?",
        const="on",
        default="off",
        choices=("off", "on", "both"),
        help="QuantConfig(rotate=...): off, on (--rotate alone), or both, side by side",
    )
    ap.add_argument(
        "--shadow",
        type=int,
        default=0,
        help="also time every config with QuantConfig(shadow=N), side by side (0: not)",
    )
    ap.add_argument(
        "--off",
        action="store_true",
        help="add qnccl with the collective not quantized (the pass-through's own cost)",
    )
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="time the configs round-robin, one call each per round, instead of one after another",
    )
    ap.add_argument(
        "--isas",
        default="",
        help="CPU codec loops to time side by side, e.g. generic,avx512 (qcomm._C.cpu_isas(); "
        "default: only the one in use)",
    )
    ap.add_argument("--csv", default=None)
    return dispatch(ap, __file__, worker, before=_header)


if __name__ == "__main__":
    sys.exit(main())
