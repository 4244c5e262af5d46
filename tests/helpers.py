"""Inspecting what a stack left on this machine: processes and sandboxes of Local nodes, and
the TCP ports a process listens on; another user's view of a local port."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

from skyward_iac.infra.engine.state_files import parse, resource_count
from skyward_iac.infra.stacks.home import file_backend, local_nodes_dir
from skyward_iac.infra.stacks.records import PROJECT
from skyward_iac.processes import sandbox_processes


def stack_sandboxes(stack_name: str) -> list[Path]:
    """The node sandboxes of a stack that still exist on disk."""
    root = local_nodes_dir() / stack_name
    return sorted(root.glob("node-*")) if root.exists() else []


def stack_processes(stack_name: str) -> list[int]:
    """Live processes (sshd, agent, tasks) belonging to any sandbox of the stack."""
    root = local_nodes_dir() / stack_name
    return sandbox_processes(root)


def stored_resource_count(stack_name: str) -> int:
    """The resources in ``stack_name``'s latest checkpoint, counted as
    ``ClusterStack.resource_count`` counts them, read from the file backend's checkpoint
    (the engine writes it whole, by rename) rather than by two engine starts (``stack
    select``, ``stack export``: 0.3-1 CPU-s). For loops that wait on it: a wait of 20 s that
    asked the engine every 0.2 s kept a core busy. Through the engine on any other backend."""
    directory = file_backend()
    if directory is None:
        from skyward_iac.infra.stacks.stack import ClusterStack

        return ClusterStack.select(stack_name).resource_count()
    stacks = directory / ".pulumi" / "stacks" / PROJECT
    for name in (f"{stack_name}.json", f"{stack_name}.json.gz"):
        try:
            return resource_count(parse((stacks / name).read_bytes()))
        except FileNotFoundError:
            continue
    raise FileNotFoundError(f"no checkpoint of stack {stack_name} in {stacks}")


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its sockets' inodes matched in /proc/net)."""
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return set()
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target.removeprefix("socket:[").removesuffix("]"))
    # gRPC listens on a dual-stack socket (127.0.0.1 as ::ffff:127.0.0.1): look in both tables.
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                ports.add(int(fields[1].split(":")[1], 16))
    return ports


_GET = """
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30) as s:
    s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
    try:
        print(repr(s.recv(100)))
    except ConnectionResetError:
        print("reset")
"""


def http_get_as_nobody(port: int) -> str:
    """What user ``nobody`` reads back for an HTTP GET on ``127.0.0.1:port``: the repr of the
    first bytes (``b\'\'`` for a connection closed unanswered), or ``reset``."""
    done = subprocess.run(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable,
         "-c", _GET, str(port)], capture_output=True, text=True, timeout=60, cwd="/",
        env={**os.environ, "PYTHONPATH": ""}, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def interrupted_script(args: list[str], marker: str, cwd: Path,
                       timeout: float = 300) -> tuple[int, str]:
    """Run ``python ARGS`` and send it SIGINT (a Ctrl+C) when a line of its output holds
    ``marker``; its exit status and whole output (stdout and stderr together)."""
    child = subprocess.Popen([sys.executable, *args], cwd=cwd, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(cwd)})
    assert child.stdout is not None
    lines: list[str] = []
    for line in child.stdout:
        lines.append(line)
        if marker in line:
            child.send_signal(signal.SIGINT)
            break
    rest, _ = child.communicate(timeout=timeout)
    return child.returncode, "".join(lines) + rest


def free_loopback_address(ports: int = 2) -> tuple[str, list[int]]:
    """A random 127.x.y.z address and ``ports`` ports free on it (a real etcd's client and
    peer ports): tests running at once rarely meet on one address."""
    address = f"127.0.{random.randint(1, 254)}.{random.randint(2, 254)}"
    found = []
    for _ in range(ports):
        with socket.socket() as probe:
            probe.bind((address, 0))
            found.append(probe.getsockname()[1])
    return address, found
