"""Where a Local pool's CPU goes: CPU-seconds per kind of process over one pool's whole life.

Runs a pool script (``with sky.Compute(provider=sky.Local(), nodes=N)``, the quickstart's calls,
then exit and destroy) for 1 and 2 nodes, each in a cgroup v2 of its own, and a bare
``python -c pass`` as the peer of the same run. Every process the pool starts is accounted, also
the nodes' processes that leave for their own cgroups and the daemons that ``setsid`` away:

* Linux process accounting (``acct(2)``, as root) writes one record per process as it exits,
  with its parent, command name and CPU time (10 ms granularity per process);
* the bench is the children's subreaper, so an orphan's parent is the bench, never init;
* a sampler reads ``/proc`` every 20 ms for the command lines that tell the Python processes
  apart (language host, provider, agent, worker...); a process too short-lived to be sampled is
  named by its command name.

The processes of one run are its pool script and, transitively, every process whose parent
(at its exit) belongs to the run. Beside that sum, the exact CPU by cgroup: the run's own
``cpu.stat`` (the client side) plus the last read of each of its nodes' cgroups (a node's sshd
and all its sessions move to one of their own, deleted at destroy). The by-cgroup figure is the
truer total: acct truncates each process to 10 ms ticks, so hundreds of short shells (the sshd
sessions' ``.bashrc``) count as ~0 there. The peer's CPU is its cgroup's, for the same reason.
acct is one file for the whole machine: two benches at once take each other's records (a run
whose own record is missing says so), the by-cgroup figures are unaffected.
The pools run the skyward_iac of the checkout the script is in (PYTHONPATH), so a copy of
another commit (``git archive``) measures that commit under the same conditions.

Run (root, Linux, cgroup v2): .venv/bin/python bench/pool_cpu.py [--nodes 1 2] [--show-cmds]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PR_SET_CHILD_SUBREAPER = 36
#: ``struct acct_v3`` of <linux/acct.h>: 64 bytes a record.
ACCT_V3 = struct.Struct("<BBHIIIIIIf8H16s")
AHZ = 100

POOL_SCRIPT = """
import json, sys, time
t0 = time.monotonic()
import skyward_iac as sky
t1 = time.monotonic()

@sky.function
def square(x: int) -> int:
    return x * x

compute = sky.Compute(provider=sky.Local(), nodes=int(sys.argv[1]))
with compute as pool:
    t2 = time.monotonic()
    assert [square(i) >> pool for i in range(5)] == [0, 1, 4, 9, 16]
    assert square(7) @ pool == [49] * int(sys.argv[1])
    t3 = time.monotonic()
t4 = time.monotonic()
print(json.dumps({"skyward_iac": sky.__file__, "import": t1 - t0, "up": t2 - t1, "calls": t3 - t2, "destroy": t4 - t3,
                  "timings": {k: round(v, 3) for k, v in compute.timings.items()}}))
"""

#: (kind, substring of the command line or, unsampled, the command name), first match wins.
KINDS: tuple[tuple[str, str], ...] = (
    ("dynamic provider (python)", "provider_host"),
    ("dynamic provider (python)", "pulumi-resource-pulumi-python"),
    ("node agent", "skyward_iac.node agent"),
    ("node worker", "skyward_iac.node worker"),
    ("node watchdog", "skyward_iac.node watchdog"),
    ("node etcd launcher (python)", "skyward_iac.node etcd-server"),
    ("etcd", "etcd"),
    ("pulumi engine (CLI runs)", "pulumi"),
    ("sshd", "sshd"),
    ("node bootstrap (uv, python -c, tar)", "/bin/uv "),
    ("node bootstrap (uv, python -c, tar)", "venv/bin/python -"),
    ("node bootstrap (uv, python -c, tar)", "tar"),
    ("node bootstrap (uv, python -c, tar)", "gzip"),
    ("node bootstrap (uv, python -c, tar)", "uv"),
)
#: Short-lived tools (shells and coreutils), one line for all.
TOOLS = {"bash", "sh", "cat", "sleep", "readlink", "sort", "mkdir", "rm", "chmod", "tr", "sed",
         "diff", "basename", "dirname", "xargs", "stat", "head", "touch", "uname", "seq", "tee",
         "mktemp", "docker", "id", "env", "grep", "awk", "ls", "cut", "wc"}


def comp_t(value: int) -> int:
    """Decode a ``comp_t`` (13-bit mantissa, 3-bit base-8 exponent)."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def read_acct(path: Path) -> list[dict[str, object]]:
    """The records of an acct(2) file: pid, ppid, comm, CPU seconds."""
    data = path.read_bytes()
    records = []
    for offset in range(0, len(data) - ACCT_V3.size + 1, ACCT_V3.size):
        fields = ACCT_V3.unpack_from(data, offset)
        records.append({"pid": fields[6], "ppid": fields[7], "btime": fields[8],
                        "cpu": (comp_t(fields[10]) + comp_t(fields[11])) / AHZ,
                        "comm": fields[18].split(b"\0")[0].decode(errors="replace")})
    return records


class Sampler(threading.Thread):
    """Remembers the command line and parent of every process on the machine, and the CPU of
    every node cgroup of this bench's pools, 50 times a second."""

    def __init__(self, home: str, nodes_cgroups: Path) -> None:
        super().__init__(daemon=True)
        self.home, self.nodes_cgroups = home, nodes_cgroups
        self.cmdlines: dict[int, str] = {}
        self.parents: dict[int, int] = {}
        #: node cgroup -> (first seen, last CPU-seconds read); None: another user's node.
        self.node_groups: dict[str, tuple[float, float] | None] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            time.sleep(0.02)

    def sample(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                self.parents[pid] = int(stat.rsplit(")", 1)[1].split()[1])
                if pid not in self.cmdlines:
                    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
                    if raw:
                        self.cmdlines[pid] = raw.replace(b"\0", b" ").decode(errors="replace")
            except (OSError, IndexError, ValueError):
                continue
        if self.nodes_cgroups.is_dir():
            for group in self.nodes_cgroups.iterdir():
                self.sample_group(group)

    def sample_group(self, group: Path) -> None:
        """A node's cgroup is deleted at destroy: keep the last CPU read while it lived."""
        known = self.node_groups.get(group.name, ())
        if known is None:
            return
        try:
            if not known:  # new: ours if its sshd was started from this bench's SKYWARD_HOME
                pids = (group / "cgroup.procs").read_text().split()
                if not pids:
                    return
                ours = self.home in Path(f"/proc/{pids[0]}/cmdline").read_text(errors="replace")
                self.node_groups[group.name] = (time.time(), 0.0) if ours else None
                if not ours:
                    return
            first_seen = self.node_groups[group.name][0]  # type: ignore[index]
            self.node_groups[group.name] = (first_seen, usage_seconds(group))
        except (OSError, IndexError):
            return

    def node_cpu(self, began: float, ended: float) -> float:
        """CPU-seconds of the node cgroups that appeared between ``began`` and ``ended``."""
        return sum(seen[1] for seen in self.node_groups.values()
                   if seen is not None and began <= seen[0] <= ended)


def kind_of(comm: str, cmdline: str, root: bool) -> str:
    if root:
        return "client (pool script)"
    text = cmdline or comm
    for kind, needle in KINDS:
        if needle in text:
            return kind
    if comm in TOOLS:
        return "shell tools (bash, cat, sleep, ...)"
    if "python" in comm or "python" in cmdline:
        return f"python other: {cmdline[:90]}" if cmdline else "python (unsampled)"
    return comm


def cgroup_root() -> Path:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] == "cgroup2":
            return Path(fields[1])
    raise SystemExit("no cgroup v2 hierarchy mounted")


def usage_seconds(group: Path) -> float:
    for line in (group / "cpu.stat").read_text().splitlines():
        if line.startswith("usage_usec"):
            return int(line.split()[1]) / 1e6
    return 0.0


class Run:
    """One measured command: its pid, wall seconds, output and epoch window."""

    def __init__(self, argv: list[str], group: Path) -> None:
        """Start ``argv`` in ``group``; wait for it and every process it left behind."""
        group.mkdir()
        self.group = group
        self.began = time.time()
        started = time.monotonic()
        enter = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs")]
        child = subprocess.Popen([*enter, *argv], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        out, _ = child.communicate()
        self.pid, self.out = child.pid, out.decode()
        self.wall = time.monotonic() - started
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # reap the orphans the bench is subreaper of
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    time.sleep(0.1)
            except ChildProcessError:
                break
        self.ended = time.time()
        self.group_cpu = usage_seconds(group)
        time.sleep(1.5)  # acct's start times are whole seconds: keep the runs' windows apart


def members(records: list[dict[str, object]], root: int, me: int,
            window: tuple[float, float], others: set[int]) -> set[int]:
    """The run's processes: ``root`` and, transitively, every process whose parent at exit was
    one of them, or the bench (an orphan, reparented to its subreaper) if it began in ``window``
    and is none of the ``others`` runs' roots."""
    found = {root}
    changed = True
    while changed:
        changed = False
        for record in records:
            pid, ppid, btime = record["pid"], record["ppid"], float(record["btime"])  # type: ignore[arg-type]
            orphan = (ppid == me and pid not in others
                      and int(window[0]) <= btime <= window[1])
            if pid not in found and (ppid in found or orphan):
                found.add(pid)  # type: ignore[arg-type]
                changed = True
    return found


def account(records: list[dict[str, object]], found: set[int], root: int,
            sampler: Sampler) -> dict[str, list[float]]:
    """CPU-seconds per kind of process, one entry per process."""
    kinds: dict[str, list[float]] = defaultdict(list)
    for record in records:
        pid = int(record["pid"])  # type: ignore[call-overload]
        if pid in found:
            kind = kind_of(str(record["comm"]), sampler.cmdlines.get(pid, ""), pid == root)
            kinds[kind].append(float(record["cpu"]))  # type: ignore[arg-type]
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--show-cmds", action="store_true",
                        help="print the command line of every Python process accounted")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("acct(2) and a cgroup of its own need root")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    from skyward_iac.infra.engine import locate

    # A fresh SKYWARD_HOME for the pools' stacks; the engine already built is reused.
    os.environ.setdefault("SKYWARD_PULUMI_ROOT", str(locate.find_engine().root))
    os.environ["SKYWARD_HOME"] = tempfile.mkdtemp(prefix="skyward-poolcpu-")
    # The pools run the skyward_iac of this checkout (also under a copy of another commit).
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    base = cgroup_root() / f"bench-pool-cpu-{os.getpid()}"
    sampler = Sampler(os.environ["SKYWARD_HOME"], cgroup_root() / "skyward")
    sampler.start()
    acct_file = Path(tempfile.mkstemp(prefix="pool-cpu-", suffix=".acct")[1])
    if libc.acct(str(acct_file).encode()) != 0:
        raise SystemExit(f"acct(2) failed: errno {ctypes.get_errno()}")
    try:
        base.mkdir()
        peer = Run([sys.executable, "-c", "pass"], base / "peer")
        runs = [(n, Run([sys.executable, "-c", POOL_SCRIPT, str(n)], base / f"nodes-{n}"))
                for n in args.nodes]
    finally:
        libc.acct(None)
        sampler.stop.set()
    records = read_acct(acct_file)
    me = os.getpid()
    roots = {peer.pid} | {run.pid for _, run in runs}
    peer_cpu = peer.group_cpu  # exact: acct's 10 ms ticks would round a bare start to 0 or 1
    print(f"peer `python -c pass`: {peer_cpu:.2f} CPU-s, wall {peer.wall:.2f} s")
    for nodes, run in runs:
        found = members(records, run.pid, me, (run.began, run.ended), roots)
        kinds = account(records, found, run.pid, sampler)
        total = sum(sum(v) for v in kinds.values())
        phases = json.loads(run.out.strip().splitlines()[-1]) if run.out.strip() else {}
        node_cpu = sampler.node_cpu(run.began, run.ended)
        print(f"\n== {nodes} node(s): wall {run.wall:.1f} s, CPU {total:.2f} s by process "
              f"({total / peer_cpu:.0f}x the peer's CPU, {run.wall / peer.wall:.0f}x its wall); by cgroup "
              f"{run.group_cpu + node_cpu:.2f} s (client side {run.group_cpu:.2f} + nodes "
              f"{node_cpu:.2f}; the node watchdogs run outside both)")
        print(f"   {phases.get('skyward_iac')}; phases (wall s): " + ", ".join(
            f"{k} {v:.1f}" for k, v in phases.items() if isinstance(v, float)))
        if not any(record["pid"] == run.pid for record in records):
            # acct(2) is machine-wide: another process (a second bench) that turned it on or
            # off meanwhile took the records of this run's last processes with it.
            print("   WARNING: the pool script's own acct record is missing: accounting was "
                  "switched by another process during the run (another bench?), so the "
                  "by-process figures below are incomplete; the by-cgroup total holds")
        print(f"{'kind':<60} {'procs':>6} {'CPU-s':>7}")
        for kind, cpus in sorted(kinds.items(), key=lambda kv: -sum(kv[1])):
            print(f"{kind[:60]:<60} {len(cpus):>6} {sum(cpus):>7.2f}")
        if args.show_cmds:
            for record in records:
                if record["pid"] in found and float(record["cpu"]) > 0:  # type: ignore[arg-type]
                    cmd = sampler.cmdlines.get(int(record["pid"]), "")  # type: ignore[call-overload]
                    print(f"  {float(record['cpu']):6.2f} {record['comm']!s:<16} {cmd[:150]}")  # type: ignore[arg-type]
    acct_file.unlink()
    for group in [peer.group] + [run.group for _, run in runs]:
        group.rmdir()
    base.rmdir()


if __name__ == "__main__":
    main()
