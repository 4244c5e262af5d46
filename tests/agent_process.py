"""A real agent process on loopback for tests, and what /proc says about processes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TOKEN = "s3cret-token"


@dataclass
class Agent:
    """A running ``python -m skyward_iac.node agent``; ``workdir/run/agent.pid`` holds its
    pid, as bootstrap writes it."""

    process: subprocess.Popen[bytes]
    port: int
    workdir: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port))


@contextlib.contextmanager
def running_agent(workdir: Path, *args: str) -> Iterator[Agent]:
    """Start an agent with ``args`` (after the token and port files); stop it and its process
    group afterwards, whatever the test did to them."""
    (workdir / "run").mkdir(parents=True, exist_ok=True)
    (workdir / "token").write_text(TOKEN)
    port_file = workdir / "run" / "agent.port"
    process = subprocess.Popen(
        [sys.executable, "-m", "skyward_iac.node", "agent", "--token-file", str(workdir / "token"),
         "--port-file", str(port_file), *args],
        stdout=subprocess.DEVNULL, stderr=open(workdir / "agent.log", "wb"),  # noqa: SIM115
    )
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists():
            assert time.monotonic() < deadline and process.poll() is None, "agent did not start"
            time.sleep(0.05)
        (workdir / "run" / "agent.pid").write_text(str(process.pid))
        yield Agent(process, int(port_file.read_text()), workdir)
    finally:
        for child in children(process.pid):  # its workers, should they not die with it
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # the agent leads its own group
        process.kill()
        process.wait(10)


def closed_without_greeting(sock: socket.socket) -> bool:
    """The agent closed the connection without sending a byte (a reset when it left what we
    sent unread)."""
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (a dead process nobody reaped runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(predicate: object, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate()`` until it is true or ``timeout`` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():  # type: ignore[operator]
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def children(pid: int) -> set[int]:
    """The running children of ``pid``."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(FileNotFoundError):
            found.update(int(c) for c in (task / "children").read_text().split())
    return {c for c in found if running(c)}


def peak_rss_mb(pid: int) -> float:
    """The peak resident memory of ``pid`` so far (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


def rss_mb(pid: int) -> float:
    """The resident memory of ``pid`` now (VmRSS), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def connections_to(address: str) -> int:
    """This process's established TCP connections to ``address`` (SSH or the data port)."""
    listed = subprocess.run(["ss", "-tnpH", "state", "established", "dst", address],
                            capture_output=True, text=True, check=True).stdout
    return sum(f"pid={os.getpid()}," in line for line in listed.splitlines())
