"""One large-argument call through a real agent's TLS data port, as figure 3 makes it but without
the pool around it (no engine, no SSH): the client's ``AgentClient``, the agent and its worker,
each a process of its own on this machine. ``bench/wire_stages.py --agent`` uses it.

Besides MB/s it records the CPU each process spent per call (``/proc``): on a machine shared
with other work the split (client: pickle, TLS encryption; agent: TLS decryption into the
argument's memfd; worker: mapping it, the sum) moves far less than the wall time does.
"""

from __future__ import annotations

import os
import secrets
import signal
import ssl
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import numpy as np

from skyward_iac.node import protocol
from skyward_iac.remote import data_port
from skyward_iac.remote.agent_client import AgentClient

#: Seconds the agent has to write its port files.
_START = 30.0


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            pass
    return found


class AgentCall:
    """A real agent with a data port (TLS files in ``folder / "tls"``), one client to it."""

    def __init__(self, folder: Path, context: ssl.SSLContext) -> None:
        self.folder, self.context = folder, context
        self.cpu: list[tuple[float, float, float]] = []
        self._serial = 0

    def __enter__(self) -> Self:
        token = secrets.token_hex(16)
        (self.folder / "token").write_text(token)
        port_file, data_file = self.folder / "agent.port", self.folder / "data.port"
        self.agent = subprocess.Popen(
            [sys.executable, "-m", "skyward_iac.node", "agent", "--token-file",
             str(self.folder / "token"), "--port-file", str(port_file), "--data-bind",
             "127.0.0.1", "--tls-dir", str(self.folder / "tls"), "--data-port-file",
             str(data_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + _START
        while not data_file.exists():
            if time.monotonic() > deadline or self.agent.poll() is not None:
                raise RuntimeError("the agent did not start")
            time.sleep(0.05)
        sock = data_port.connect("127.0.0.1", int(data_file.read_text()), self.context)
        self.client = AgentClient(sock, token, node=0)
        self._call(np.ones(16))  # starts the worker
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.client.close()
        for pid in _children(self.agent.pid):
            os.kill(pid, signal.SIGKILL)
        self.agent.kill()
        self.agent.wait()

    def _call(self, array: np.ndarray[Any, Any]) -> float:
        payload, buffers = protocol.dumps_with_buffers((np.sum, (array,), {}))
        return float(self.client.submit("sum", payload, 120, buffers).result(120))

    def call(self, megabytes: int) -> float:
        """Seconds of one call carrying a fresh ``megabytes`` array (its sum checked)."""
        count = megabytes * 2**20 // 8
        self._serial += 1
        array = np.arange(self._serial * count, (self._serial + 1) * count, dtype=np.float64)
        expected = float(array.sum())
        pids = [self.agent.pid, *_children(self.agent.pid)]
        before = [time.process_time(), *(cpu_seconds(p) for p in pids)]
        started = time.perf_counter()
        if self._call(array) != expected:
            raise AssertionError("the agent's worker returned a wrong sum")
        elapsed = time.perf_counter() - started
        after = [time.process_time(), *(cpu_seconds(p) for p in pids)]
        spent = [b - a for a, b in zip(before, after)]
        self.cpu.append((spent[0], spent[1], sum(spent[2:])))
        return elapsed

    def cpu_summary(self) -> str:
        """The median CPU milliseconds per call of each process."""
        client, agent, worker = (statistics.median(c[i] for c in self.cpu) * 1000
                                 for i in range(3))
        return (f"CPU per call (median of {len(self.cpu)}): client {client:.0f} ms, agent "
                f"{agent:.0f} ms, worker {worker:.0f} ms")
