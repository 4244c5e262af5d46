"""A trivial task's round trip through a real agent, beside its floors, in one run.

    .venv/bin/python bench/agent_rtt.py [--calls 2000] [--tree DIR] [--concurrency 1]
        [--executor thread|process] [--json FILE]

Measured, each over ``--calls`` sequential calls after a warm-up, interleaved in rounds so a
burst of load from elsewhere hits every figure alike:

- ``agent``: ``python -m skyward_iac.node agent`` (from ``--tree``: a copy of another commit,
  to compare two versions of the node side with the same harness) driven by a real
  ``AgentClient`` over plain TCP (no SSH, no TLS; ``--tls``: over the agent's mutual-TLS data
  port, as a Local pool reaches it): the node side of a round trip plus the client's own.
- ``baseline`` (with ``--baseline DIR``): the same from another tree, in the same rounds.
- ``processpool``: ``ProcessPoolExecutor(1).submit(f, i).result()``.
- ``pingpong-2``: 64 bytes over TCP to a process that forwards them over a socket pair to a
  second process and back (the agent -> worker topology with nothing else in it).
- ``pingpong-1``: 64 bytes over TCP to one process and back.

Prints p50 and p90 in ms, the CPU time the agent and its workers spent per call (all their
threads, from /proc/PID/task/*/schedstat: unlike the wall clock, it barely moves with the load
others put on the machine) and how many times per call their threads went to sleep (voluntary
context switches: a round trip needs one per thread it crosses; more is a wake-up for nothing),
and the agent's ratios to the floors, with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "agent-rtt-token"
WARM_UP = 200
ROUNDS = 8


def noop(x: Any) -> Any:
    return x


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


# --- the floors: bare socket ping-pong -------------------------------------------------------

def _echo(sock: socket.socket, forward: socket.socket | None) -> None:
    """Answer each message on ``sock``: itself, or what ``forward`` answers to it."""
    while True:
        data = sock.recv(4096)
        if not data:
            return
        if forward is not None:
            forward.sendall(data)
            data = forward.recv(4096)
        sock.sendall(data)


def _pingpong_server(port_file: str, hops: int) -> None:
    """A process listening on loopback; with ``hops == 2`` it forwards to a child process."""
    server = socket.create_server(("127.0.0.1", 0))
    forward = None
    if hops == 2:
        ours, theirs = socket.socketpair()
        if os.fork() == 0:
            ours.close()
            server.close()
            _echo(theirs, None)
            os._exit(0)
        theirs.close()
        forward = ours
    Path(port_file + ".tmp").write_text(str(server.getsockname()[1]))
    os.replace(port_file + ".tmp", port_file)
    sock, _ = server.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _echo(sock, forward)


class PingPong:
    def __init__(self, hops: int, workdir: Path) -> None:
        port_file = workdir / f"pingpong-{hops}.port"
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--pingpong-server", str(port_file), str(hops)])
        self.sock = socket.create_connection(("127.0.0.1", _wait_for_port(port_file,
                                                                          self.process)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.message = b"x" * 64

    def call(self) -> None:
        self.sock.sendall(self.message)
        got = 0
        while got < len(self.message):
            got += len(self.sock.recv(4096))

    def close(self) -> None:
        self.sock.close()
        self.process.wait(10)


# --- the agent -------------------------------------------------------------------------------

def _wait_for_port(port_file: Path, process: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{process.args} did not start")
        time.sleep(0.02)
    return int(port_file.read_text())


class AgentUnderTest:
    def __init__(self, tree: Path, workdir: Path, concurrency: int, executor: str,
                 trace: Path | None = None, tls: bool = False) -> None:
        from skyward_iac.node import protocol
        from skyward_iac.remote.agent_client import AgentClient
        from skyward_iac.remote.calls import pack_function

        (workdir / "token").write_text(TOKEN)
        port_file = workdir / "agent.port"
        env = {**os.environ, "PYTHONPATH": str(tree)}
        if trace is not None:  # every process of the agent timestamps its hops
            site = workdir / "site"
            site.mkdir()
            (site / "sitecustomize.py").write_text((ROOT / "bench" / "rtt_trace.py").read_text())
            env.update(PYTHONPATH=f"{tree}{os.pathsep}{site}", RTT_TRACE_DIR=str(trace))
        data_port_args, context = _data_port(workdir) if tls else ([], None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "skyward_iac.node", "agent", "--token-file",
             str(workdir / "token"), "--port-file", str(port_file),
             "--concurrency", str(concurrency), "--executor", executor, *data_port_args],
            env=env, cwd=tree, stderr=open(workdir / "agent.log", "wb"))  # noqa: SIM115
        port = _wait_for_port(port_file, self.process)
        sock: socket.socket
        if context is not None:  # the data port, as a Local pool's client reaches it
            from skyward_iac.remote import data_port

            sock = data_port.connect("127.0.0.1", _wait_for_port(workdir / "data.port",
                                                                 self.process), context)
        else:
            sock = socket.create_connection(("127.0.0.1", port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client = AgentClient(sock, TOKEN, node=0)
        self._dumps = protocol.dumps
        self._function = pack_function(noop)

    def call(self, i: int) -> None:
        # Pickled per call around a function pickled once, as a pool does (remote/calls.py).
        payload = self._dumps((self._function, (i,), {}))
        self.client.submit("noop", payload, None).result(30)

    def cpu_ns(self) -> tuple[int, int]:
        """CPU time the agent and its workers have used so far (every thread's, in ns), and
        how many times their threads went to sleep."""
        pids = [self.process.pid]
        for task in Path(f"/proc/{self.process.pid}/task").glob("*"):
            pids += [int(child) for child in (task / "children").read_text().split()]
        used = [_cpu_ns(pid) for pid in pids]
        return sum(ns for ns, _ in used), sum(sleeps for _, sleeps in used)

    def close(self) -> None:
        self.client.close()
        os.killpg(self.process.pid, 9)
        self.process.wait(10)


def _data_port(workdir: Path) -> tuple[list[str], Any]:
    """The agent's arguments for a mutual-TLS data port from a fresh PKI, and the client's
    TLS context for it."""
    from skyward_iac.collections import pki
    from skyward_iac.node.etcd_server import write_certificates
    from skyward_iac.remote import data_port

    bundle = pki.generate_cluster_certificates("agent-rtt", ["127.0.0.1"])
    tls = workdir / "tls"
    # The agent presents etcd's server pair, written as the bootstrap writes it.
    write_certificates(tls, pki.IssuedCertificate(bundle.ca_pem, bundle.server_cert_pem,
                                                  bundle.server_key_pem))
    context = data_port.client_context(pki.IssuedCertificate(
        bundle.ca_pem, bundle.client_cert_pem, bundle.client_key_pem))
    return (["--data-bind", "127.0.0.1", "--tls-dir", str(tls),
             "--data-port-file", str(workdir / "data.port")], context)


def _cpu_ns(pid: int) -> tuple[int, int]:
    """On-CPU time of all of ``pid``'s threads (schedstat: ns, unlike /proc/stat's ticks) and
    their voluntary context switches (each a sleep: waiting for a frame, a lock, the GIL)."""
    total = sleeps = 0
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            total += int((task / "schedstat").read_text().split()[0])
            status = (task / "status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended meanwhile
        sleeps += int(status.split("voluntary_ctxt_switches:")[1].split()[0])
    return total, sleeps


def measure(calls: int, tree: Path, concurrency: int, executor: str,
            baseline: Path | None = None, tls: bool = False) -> dict[str, Any]:
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="agent-rtt-") as tmp:
        workdir = Path(tmp)
        agent = AgentUnderTest(tree, workdir, concurrency, executor, tls=tls)
        before = None
        if baseline is not None:
            (workdir / "baseline").mkdir()
            before = AgentUnderTest(baseline, workdir / "baseline", concurrency, executor,
                                    tls=tls)
        pool = ProcessPoolExecutor(1)
        ping1, ping2 = PingPong(1, workdir), PingPong(2, workdir)
        systems: dict[str, Callable[[int], Any]] = {
            "agent": agent.call,
            **({"baseline": before.call} if before is not None else {}),
            "processpool": lambda i: pool.submit(noop, i).result(),
            "pingpong-2": lambda i: ping2.call(),
            "pingpong-1": lambda i: ping1.call(),
        }
        try:
            for call in systems.values():
                for i in range(WARM_UP):
                    call(i)
            per_round = max(1, calls // ROUNDS)
            node_cpu = {"agent": agent, **({"baseline": before} if before is not None else {})}
            cpu: dict[str, int] = dict.fromkeys(node_cpu, 0)
            sleeps: dict[str, int] = dict.fromkeys(node_cpu, 0)
            for _ in range(ROUNDS):
                for name, call in systems.items():
                    bucket = samples.setdefault(name, [])
                    used, slept = node_cpu[name].cpu_ns() if name in node_cpu else (0, 0)
                    for i in range(per_round):
                        started = time.perf_counter()
                        call(i)
                        bucket.append((time.perf_counter() - started) * 1e3)
                    if name in node_cpu:
                        now_used, now_slept = node_cpu[name].cpu_ns()
                        cpu[name] += now_used - used
                        sleeps[name] += now_slept - slept
        finally:
            agent.close()
            if before is not None:
                before.close()
            pool.shutdown()
            ping1.close()
            ping2.close()
    figures = {name: {"p50": percentile(s, 50), "p90": percentile(s, 90), "n": len(s)}
               for name, s in samples.items()}
    for name, used in cpu.items():  # the node's CPU per round trip: robust to others' load
        figures[name]["node_cpu_us"] = used / 1e3 / len(samples[name])
        figures[name]["node_sleeps"] = sleeps[name] / len(samples[name])
    agent50 = figures["agent"]["p50"]
    return {
        "tree": str(tree), "baseline": str(baseline), "tls": tls, "load": os.getloadavg(),
        "figures": figures,
        "ratios": {name: agent50 / f["p50"] for name, f in figures.items() if name != "agent"},
    }


def trace(calls: int, tree: Path, concurrency: int, executor: str, tls: bool = False) -> str:
    """The agent alone, every hop timestamped (bench/rtt_trace.py): the median time from each
    event of a round trip to the next."""
    import rtt_trace

    with tempfile.TemporaryDirectory(prefix="agent-rtt-") as tmp:
        workdir, traces = Path(tmp), Path(tmp) / "traces"
        traces.mkdir()
        agent = AgentUnderTest(tree, workdir, concurrency, executor, traces, tls)
        try:
            for i in range(WARM_UP):
                agent.call(i)
            rtt_trace.install(str(traces))
            note = rtt_trace.note  # type: ignore[attr-defined]
            for i in range(calls):
                note("call>")
                agent.call(i)
                note("call<")
            note("end")
            for i in range(1000):  # the processes write what they hold every 1,000 events
                agent.call(i)
        finally:
            agent.close()
        events = []
        for path in traces.glob("*.trace"):
            for line in path.read_text().splitlines():
                at, pid, thread, event = line.split(" ", 3)
                events.append((int(at), int(pid), thread, event))
    events.sort()
    me, agent_pid = os.getpid(), agent.process.pid
    role = {me: "client", agent_pid: "agent"}
    calls_seen: list[list[tuple[int, str]]] = []
    current: list[tuple[int, str]] | None = None
    for at, pid, thread, event in events:
        label = f"{role.get(pid, 'worker')}:{thread.split('-')[0]}:{event}"
        if pid == me and event == "call>":
            current = []
            calls_seen.append(current)
        elif pid == me and event == "end":
            break
        if current is not None:
            current.append((at, label))
    shapes: dict[tuple[str, ...], list[list[int]]] = {}
    for call in calls_seen:
        shapes.setdefault(tuple(label for _, label in call), []).append([at for at, _ in call])
    shape, timings = max(shapes.items(), key=lambda item: len(item[1]))
    lines = [(f"{len(timings)} of {len(calls_seen)} round trips had this shape "
              "(median µs from the previous event):")]
    for position, label in enumerate(shape):
        if position == 0:
            continue
        deltas = sorted((t[position] - t[position - 1]) / 1e3 for t in timings)
        lines.append(f"  {deltas[len(deltas) // 2]:8.1f}  {label}")
    totals = sorted((t[-1] - t[0]) / 1e3 for t in timings)
    lines.append(f"  {totals[len(totals) // 2]:8.1f}  total (median)")
    return "\n".join(lines)


def report(result: dict[str, Any]) -> str:
    lines = [f"tree {result['tree']}  baseline {result['baseline']}  tls {result['tls']}  load {' '.join(f'{x:.2f}' for x in result['load'])}"]
    for name, f in result["figures"].items():
        cpu = (f"  node CPU {f['node_cpu_us']:.0f} µs, {f['node_sleeps']:.2f} sleeps/call"
               if "node_cpu_us" in f else "")
        lines.append(f"  {name:12s} p50 {f['p50']:.3f} ms  p90 {f['p90']:.3f} ms  (n={f['n']})"
                     + cpu)
    lines.append("  agent / " + ", ".join(f"{name} {r:.2f}x"
                                           for name, r in result["ratios"].items()))
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--pingpong-server":
        _pingpong_server(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--tree", type=Path, default=ROOT,
                        help="the source tree the agent runs from (default: this one)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="also an agent from this tree (e.g. a copy of HEAD), interleaved")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--executor", choices=("thread", "process"), default="thread")
    parser.add_argument("--tls", action="store_true",
                        help="reach the agents over their mutual-TLS data port, not plain TCP")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--trace", action="store_true",
                        help="instead: the agent alone, each stage of a round trip timed")
    args = parser.parse_args()
    if args.trace:
        print(trace(args.calls, args.tree.resolve(), args.concurrency, args.executor, args.tls))
        return
    result = measure(args.calls, args.tree.resolve(), args.concurrency, args.executor,
                     args.baseline.resolve() if args.baseline else None, args.tls)
    print(report(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
