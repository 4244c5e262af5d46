"""A real Jupyter kernel (ipykernel) driven over its channels, for the notebook tests.

Every IOPub message is kept, so a test can ask what a cell printed, under which cell a line
arrived, and wait for a line while the cell still runs (to interrupt it at that point).
"""

from __future__ import annotations

import os
import queue
import re
import time
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager


def ipython_dir(root: Path) -> Path:
    """An empty IPython directory, so the kernels do not read the user's own profile."""
    (root / "profile_default").mkdir(parents=True, exist_ok=True)
    return root


class Kernel:
    """One ipykernel process and a client; ``run`` sends a cell, ``wait`` waits for its end."""

    def __init__(self, cwd: Path, ipython: Path) -> None:
        self.manager = KernelManager(kernel_name="python3")
        self.manager.start_kernel(cwd=str(cwd), env={**os.environ, "IPYTHONDIR": str(ipython)})
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        #: Every IOPub message so far, in arrival order.
        self.messages: list[dict[str, Any]] = []
        self.pid = int(self.value("import os; print(os.getpid())"))

    def run(self, code: str) -> str:
        """Send a cell; its message id."""
        return self.client.execute(code, store_history=True)

    def _pump(self, timeout: float) -> None:
        try:
            self.messages.append(self.client.get_iopub_msg(timeout=timeout))
        except queue.Empty:
            return
        while True:
            try:
                self.messages.append(self.client.get_iopub_msg(timeout=0))
            except queue.Empty:
                return

    def of(self, cell: str, *kinds: str) -> list[dict[str, Any]]:
        """The contents of the messages a cell was the parent of (of these kinds)."""
        return [m["content"] for m in self.messages
                if m["parent_header"].get("msg_id") == cell
                and (not kinds or m["msg_type"] in kinds)]

    def text(self, cell: str, stream: str | None = None) -> str:
        """What the cell printed: on ``stream`` ("stdout", "stderr"), or on both."""
        return "".join(c["text"] for c in self.of(cell, "stream")
                       if stream is None or c["name"] == stream)

    def done(self, cell: str) -> bool:
        return any(c.get("execution_state") == "idle" for c in self.of(cell, "status"))

    def wait(self, cell: str, timeout: float = 300) -> dict[str, Any] | None:
        """Wait for the cell to finish; its error (``ename``, ``evalue``) or None."""
        deadline = time.monotonic() + timeout
        while not self.done(cell):
            if time.monotonic() > deadline:
                raise AssertionError(f"cell still running after {timeout}s:\n"
                                     + self.text(cell)[-3000:])
            self._pump(0.2)
        errors = self.of(cell, "error")
        return errors[0] if errors else None

    def wait_for(self, cell: str, pattern: str, timeout: float = 180) -> re.Match[str]:
        """Wait until the cell's output matches ``pattern`` (the cell still runs)."""
        deadline = time.monotonic() + timeout
        while not (found := re.search(pattern, self.text(cell), re.MULTILINE)):
            if self.done(cell) or time.monotonic() > deadline:
                raise AssertionError(f"never saw {pattern!r}:\n" + self.text(cell)[-3000:])
            self._pump(0.05)
        return found

    def value(self, code: str, timeout: float = 120) -> str:
        """Run a cell and return what it printed (it must not fail)."""
        cell = self.run(code)
        error = self.wait(cell, timeout)
        assert error is None, error
        return self.text(cell).strip()

    def settle(self, seconds: float) -> None:
        """Keep collecting IOPub messages for a while (output that arrives after a cell)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._pump(0.1)

    def interrupt(self) -> None:
        """The notebook's stop button: SIGINT to the kernel's process group."""
        self.manager.interrupt_kernel()

    def shutdown(self) -> None:
        """What closing the notebook does: a shutdown request, SIGTERM/SIGKILL if it lingers."""
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=False)
