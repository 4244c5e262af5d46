"""Figure 7: the real client of a pool against a simulated fleet of 10 to 1,000 nodes.

Each size runs in a fresh client process, which starts its own simulator (``fleet_sim.py``: one
process, every node an SSH server and an agent speaking the real protocol; it says what it
skips). The client is a pool's own parts (``orchestration/parts.PoolParts``, what a
``sky.Compute`` builds) adopting the simulated nodes as it adopts a warm pool's: the
``Dispatcher``, ``Membership``, ``NodeEvents``, ``Heartbeat``, lease and ``Reconciler``, whose
start threads run ``Node.attach`` (SSH with the pinned host key, the first heartbeat over SFTP,
the agent tunnel, the handshake, ``Configure``), then the ``Pool`` and its watchers. Left out on
the client: the Pulumi stack (``SkippedStack``) and the bootstrap, the console, and the
collections' etcd tunnel (the simulated head runs no etcd).

Per size: connect (adopt to every node in service), broadcast latency (``fn() @ pool``, median
of 5 after one), a ``map`` of 100,000 trivial tasks, the client's CPU seconds, threads, RSS and
file descriptors once ready, its CPU while idle, and close; the simulator's CPU beside them
(it shares the machine's cores with the client). ``report`` prints every figure beside linear
growth from the smallest size.

Run: .venv/bin/python bench/fleet.py [--nodes 10 100 300 1000] [--json FILE];
bench/run.py runs it as figure 7 (``--fleet-nodes``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Self

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import fleet_explain
import fleet_report

import skyward_iac as sky

SIZES = (10, 100, 300, 1000)
MAP_TASKS = 100_000
BROADCASTS = 5
IDLE_SECONDS = 5.0
#: Options.ssh_timeout for the measured pools (the default is 30 s): each SSH operation of a
#: node's start may wait this long while a thousand of them share the client's 2 cores.
SSH_TIMEOUT = 120.0
#: Seconds a size's nodes may take to be all in service before the size is given up.
CONNECT_LIMIT = 900.0


@sky.function
def noop(x: int = 0) -> int:
    return x


class Simulator:
    """A ``fleet_sim.py`` process of ``nodes`` nodes for the length of a ``with`` block."""

    def __init__(self, nodes: int, data_port: bool = True) -> None:
        self.nodes = nodes
        self._dir = tempfile.TemporaryDirectory(prefix="skyward-fleet-")
        fleet_file = Path(self._dir.name) / "fleet.json"
        #: Where the nodes' SFTP writes land (node ``i``'s workdir is ``root/node-i``).
        self.root = Path(self._dir.name) / "nodes"
        self.process = subprocess.Popen(
            [sys.executable, str(BENCH / "fleet_sim.py"), "--nodes", str(nodes),
             "--fleet-file", str(fleet_file), "--root", str(self.root),
             *([] if data_port else ["--no-data-port"])],
            stdin=subprocess.PIPE)
        deadline = time.monotonic() + 60 + nodes * 0.1
        while not fleet_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the fleet simulator did not start {nodes} node(s)")
            time.sleep(0.05)
        self.fleet: dict[str, Any] = json.loads(fleet_file.read_text())
        self._stats = fleet_file.with_suffix(".stats")
        #: What the simulator served (tasks, task frames), read when it stops.
        self.stats: dict[str, int] = {}

    def cpu(self) -> float:
        """The simulator's CPU seconds so far (user + system, every thread)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self._stats.exists():
            self.stats = json.loads(self._stats.read_text())
        self._dir.cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def outputs_of(fleet: dict[str, Any]) -> tuple[Any, dict[int, int]]:
    """The ``ClusterOutputs`` a stack would give for the simulated nodes, and their agent
    ports (what a warm pool's keeper hands over)."""
    from skyward_iac.outputs import ClusterOutputs, EtcdMaterial, NodeAddress

    nodes = tuple(NodeAddress(index=n["index"], private_address="127.0.0.1",
                              public_address="127.0.0.1", ssh_port=n["port"],
                              ssh_user=fleet["ssh_user"], host_key=n["host_key"],
                              workdir=n["workdir"]) for n in fleet["nodes"])
    # The stack's PKI (the simulator's data ports present its server pair): with it the client
    # reaches each agent over its data port, as on a Local or cloud node, and SSH only starts it.
    pki = EtcdMaterial(**fleet["pki"]) if fleet.get("pki") else None
    outputs = ClusterOutputs(nodes=nodes, ssh_private_key=fleet["ssh_private_key"],
                             agent_token=fleet["agent_token"], etcd=pki)
    return outputs, {n["index"]: fleet["agent_port"] for n in fleet["nodes"]}


class SkippedStack:
    """Where a pool's parts would reach its Pulumi stack: figure 7 has none. Adopting nodes
    and serving calls never touch it; the lease renewal (every ttl/3) does nothing here."""

    def renew_lease(self, *args: Any) -> None:
        """Nothing to renew: no stack."""


class FleetPool:
    """The client of a pool whose nodes are the simulator's: the pool's own parts
    (``PoolParts``, as a ``sky.Compute`` builds them) adopting the nodes as a warm pool's."""

    def __init__(self, fleet: dict[str, Any], options: Any = None) -> None:
        from skyward_iac.observability.bus import EventBus
        from skyward_iac.orchestration.parts import PoolParts
        from skyward_iac.orchestration.plan import plan_pool
        from skyward_iac.orchestration.pool import print_output

        self.outputs, self.ports = outputs_of(fleet)
        plan = plan_pool((), None, options or sky.Options(),
                         {"provider": sky.Local(), "nodes": len(self.ports)})
        self.parts = PoolParts(plan, SkippedStack(), EventBus(),  # type: ignore[arg-type]
                               print_output, on_spent=lambda error: None)

    def connect(self, timeout: float) -> Any:
        """Every node in service (SSH, first heartbeat, tunnel, handshake, Configure); the
        ``Pool``, with what watches it started."""
        parts = self.parts
        parts.reconciler.adopt(self.outputs, self.ports)
        parts.wait_ready(len(self.ports), timeout)
        pool = parts.serve()
        parts.watch()
        return pool

    def close(self) -> None:
        """The pool's teardown (no stack to destroy)."""
        self.parts.membership.stop("pool closed")
        self.parts.teardown.run()


def client_status() -> dict[str, float]:
    """This process's CPU seconds, RSS (MiB), threads and open file descriptors."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text()
                  .splitlines() if ":" in line)
    return {"cpu": time.process_time(), "rss": int(fields["VmRSS"].split()[0]) / 1024,
            "threads": int(fields["Threads"]), "fds": len(os.listdir("/proc/self/fd"))}


def kind(thread: threading.Thread) -> str:
    """A thread's name with its digits folded (``agent-N-reader``); paramiko's transports,
    which keep Python's default name, are named so."""
    import paramiko

    return "paramiko.Transport" if isinstance(thread, paramiko.Transport) else re.sub(
        r"\d+", "N", thread.name)


def thread_cpu() -> Counter[str]:
    """CPU seconds each kind of thread alive now has spent (``/proc/self/task``)."""
    spent: Counter[str] = Counter()
    tick = os.sysconf("SC_CLK_TCK")
    for thread in threading.enumerate():
        try:
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        spent[kind(thread)] += (int(fields[11]) + int(fields[12])) / tick
    return spent


def census() -> dict[str, dict[str, int]]:
    """What this process holds, by kind: threads by name (digits folded), descriptors by type."""
    threads = Counter(kind(t) for t in threading.enumerate())
    kinds: Counter[str] = Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            kinds[re.sub(r"[:\[].*", "", os.readlink(f"/proc/self/fd/{fd}")) or "?"] += 1
        except OSError:
            pass
    return {"threads": dict(threads.most_common()), "fds": dict(kinds.most_common())}


@contextmanager
def private_home() -> Iterator[None]:
    """A ``SKYWARD_HOME`` of its own for the block: the pool's lease records its holder there,
    not among the user's stacks."""
    previous = os.environ.get("SKYWARD_HOME")
    with tempfile.TemporaryDirectory(prefix="skyward-fleet-home-") as home:
        os.environ["SKYWARD_HOME"] = home
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop("SKYWARD_HOME", None)
            else:
                os.environ["SKYWARD_HOME"] = previous


@contextmanager
def timeline(membership: Any, into: dict[str, Any], every: float = 1.0) -> Iterator[None]:
    """``connect timeline``: (seconds, nodes in service) every ``every`` s of the block."""
    started, points, done = time.monotonic(), [], threading.Event()

    def sample() -> None:
        while not done.wait(every):
            points.append((round(time.monotonic() - started, 1), membership.ready_count()))

    sampler = threading.Thread(target=sample, name="fleet-timeline", daemon=True)
    sampler.start()
    try:
        yield
    finally:
        done.set()
        sampler.join()
        points.append((round(time.monotonic() - started, 1), membership.ready_count()))
        into["connect timeline"] = points


@contextmanager
def measured(into: dict[str, Any], name: str, sim: Simulator) -> Iterator[None]:
    """Record ``name`` s, the client's and the simulator's CPU seconds of the block, and the
    client's by kind of thread (threads that ended within the block are not counted)."""
    by_thread, cpu, sim_cpu, started = thread_cpu(), time.process_time(), sim.cpu(), \
        time.monotonic()
    yield
    into[f"{name} s"] = time.monotonic() - started
    into[f"{name} client CPU s"] = time.process_time() - cpu
    into[f"{name} sim CPU s"] = sim.cpu() - sim_cpu
    spent = thread_cpu()
    spent.subtract(by_thread)
    into.setdefault("thread CPU s", {})[name] = {k: round(v, 2) for k, v in spent.most_common()
                                                 if v > 0}


def one(nodes: int, tasks: int = MAP_TASKS, explain: bool = False,
        idle: float = IDLE_SECONDS, connect_limit: float = CONNECT_LIMIT,
        data_port: bool = True) -> dict[str, Any]:
    """Figure 7 at ``nodes`` nodes, in this (fresh) process; ``explain`` adds the
    instruments of ``fleet_explain`` (and their cost); ``data_port=False``: agents reached
    through SSH tunnels, as before the data port. Nodes not all in service after
    ``connect_limit`` seconds end the size: ``connect failed`` says how many were."""
    import skyward_iac.orchestration.compute  # noqa: F401 - imports are not the pool's cost
    from skyward_iac.orchestration.dispatch import Dispatcher

    figures: dict[str, Any] = {"load average": os.getloadavg()[0], "path": (
        "data port" if data_port else "SSH tunnel")}
    explained: dict[str, Any] = {}
    with private_home(), Simulator(nodes, data_port) as sim:
        before = client_status()
        fleet = FleetPool(sim.fleet, sky.Options(ssh_timeout=SSH_TIMEOUT))
        try:
            try:
                with measured(figures, "connect", sim), timeline(
                        fleet.parts.membership, figures), (fleet_explain.memory_by_file(
                        explained, nodes) if explain else nullcontext()):
                    pool = fleet.connect(timeout=connect_limit)
            except Exception as exc:  # noqa: BLE001 - reported as this size's figure
                figures["connect failed"] = {
                    "ready": fleet.parts.membership.ready_count(),
                    "after s": figures["connect timeline"][-1][0], "why": str(exc)[:300]}
                return figures
            ready = client_status()
            figures.update({f"{k} at ready": v for k, v in ready.items() if k != "cpu"})
            figures.update({f"{k} per node": (ready[k] - before[k]) / nodes
                            for k in ("rss", "threads", "fds")})
            figures["census"] = census()
            with measured(figures, "idle", sim):
                time.sleep(idle)
            assert noop(1) @ pool == [1] * nodes  # warm-up: each node's pace, the function
            samples = []
            with measured(figures, "broadcasts", sim):
                for _ in range(BROADCASTS):
                    sent = time.monotonic()
                    assert noop(2) @ pool == [2] * nodes
                    samples.append(time.monotonic() - sent)
            figures["broadcast ms"] = statistics.median(samples) * 1000
            figures["broadcasts"] = BROADCASTS
            with measured(figures, "map", sim), (fleet_explain.timed_method(
                    explained, Dispatcher, "_place") if explain else nullcontext()):
                assert sum(pool.map(noop, range(tasks))) == sum(range(tasks))
            figures["map tasks/s"] = tasks / figures["map s"]
            figures["peak rss"] = peak_rss()
            # Once the work is done: what the client keeps while a pool of this size lives
            # (issue 32 goal 3 asks <= 32 threads at any size).
            steady = client_status()
            figures["threads steady"] = steady["threads"]
            figures["rss steady per node"] = (steady["rss"] - before["rss"]) / nodes
            figures["census steady"] = census()
        finally:
            with measured(figures, "close", sim):
                fleet.close()
    figures["tasks per frame"] = sim.stats["tasks"] / max(1, sim.stats["task frames"])
    if explain:
        figures["explained"] = explained
    return figures


def peak_rss() -> float:
    """This process's peak RSS (MiB) since its exec."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def measure(sizes: list[int], tasks: int = MAP_TASKS,
            extra: tuple[str, ...] = ()) -> dict[int, dict[str, Any]]:
    """Figure 7 for each size, each in a fresh client process (with its own simulator);
    ``extra``: more arguments for each (``--explain``, ``--poll S``)."""
    results = {}
    for nodes in sizes:
        print(f"[fleet] {nodes} node(s)...", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, __file__, "--one", str(nodes), "--tasks",
                               str(tasks), *extra], check=False, stdout=subprocess.PIPE,
                              text=True)
        if done.returncode != 0:  # said on stderr; the other sizes are still worth having
            print(f"[fleet] {nodes} node(s) failed (exit {done.returncode})", file=sys.stderr)
            continue
        results[nodes] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--tasks", type=int, default=MAP_TASKS, help="the map's size")
    parser.add_argument("--json", type=Path, help="also write the raw figures here")
    parser.add_argument("--explain", action="store_true",
                        help="also measure memory by source file and the dispatcher's CPU")
    parser.add_argument("--poll", type=float,
                        help="an experiment: paramiko's idle wake-up interval (default 0.1 s)")
    parser.add_argument("--tunnel", action="store_true",
                        help="nodes without a data port: agents reached through SSH tunnels")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # NODES, in this process
    args = parser.parse_args()
    if args.one:
        if args.poll is not None:
            fleet_explain.set_poll(args.poll)
        print(json.dumps(one(args.one, args.tasks, args.explain, data_port=not args.tunnel)))
        return
    extra = (*(["--explain"] if args.explain else []), *(["--tunnel"] if args.tunnel else []),
             *(["--poll", str(args.poll)] if args.poll is not None else []))
    figures = measure(args.nodes, args.tasks, extra)
    if not figures:
        sys.exit("figure 7: no size could be measured")
    print(fleet_report.report(figures))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
