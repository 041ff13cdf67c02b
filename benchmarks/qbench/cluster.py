"""A bandwidth-limited CPU cluster on one machine: N ranks, each in its own network namespace.

Topology: namespaces qcomm-r0 .. qcomm-r{N-1} and a switch namespace qcomm-sw holding a bridge.
Each rank reaches the bridge through a veth pair; a `tc tbf` rate limit on both ends of each pair
limits the rank's upload and download to --rate (optional --delay adds netem latency). Addresses
10.77.0.1.. live only inside these namespaces. Gloo is bound to each rank's veth
(GLOO_SOCKET_IFNAME). Everything is removed at the end, also on failure or Ctrl-C. Needs root (ip
netns, tc); --rate loopback (or --local) runs the ranks on this host over 127.0.0.1 instead.

A script over the emulated link (slow_cluster.py, ddp_slow_link.py, ...) takes add_cluster_args'
options and ends in dispatch(ap, __file__, worker): the parent sets the cluster up and starts the
script again in each rank's namespace with --worker --rank i, where worker(args) runs; a rank
joins its groups with join(args, ...).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from . import ROOT

PREFIX = "qcomm"
SUBNET = "10.77.0"


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    """Runs a command (ip, tc), its output captured; raises on failure with check."""
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def ns_names(world: int):
    """([the ranks' namespaces], the switch's namespace)."""
    return [f"{PREFIX}-r{i}" for i in range(world)], f"{PREFIX}-sw"


def teardown(world: int) -> None:
    """Deletes the namespaces of a cluster of up to max(world, 8) ranks, and with them the veths."""
    ranks, sw = ns_names(max(world, 8))
    for ns in ranks + [sw]:
        sh("ip", "netns", "del", ns, check=False)  # deleting a namespace removes its veths


def setup(world: int, rate: str, delay: str | None) -> None:
    """Makes the cluster: the switch's bridge, each rank's namespace and veth pair, and the rate
    limit (tbf; `rate` "none": none) with the optional netem `delay` on both ends of each pair."""
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


def join(args, backend: str = "gloo", pg_options=None):
    """In a rank's namespace: --threads torch threads, the default group of `backend` through
    rank 0's address, and a separate Gloo group for the script's barriers and timings (never a
    group being timed), which it returns."""
    import torch
    import torch.distributed as dist

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


def _wait(procs, name: str, timeout: float) -> int:
    """0 when every rank's process exits 0 within `timeout` seconds, else 1 (the rest killed)."""
    try:
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


def run_workers(script: str, world: int, rate: str, delay, argv, timeout: float) -> int:
    """Runs `script --worker --rank i <argv>` in rank i's namespace of a fresh cluster (torn down
    afterwards, also on failure or Ctrl-C), Gloo bound to the rank's veth; 0 when every rank
    exits 0. The scripts that time things over the emulated link (slow_cluster.py,
    ddp_slow_link.py, async_overlap.py, examples/diloco.py, ...) all start their ranks here."""
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
        return _wait(procs, name, timeout)
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
        return _wait(procs, os.path.basename(script), timeout)
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
