"""What a pool does differently inside a Jupyter kernel (``ipykernel``).

Two things, both no-ops in any other process:

* ``cell_context()``: the context a task is submitted from. ipykernel keeps the cell being run
  (its "parent header") in a context variable, and output written inside that context is sent
  to the frontend as output of that cell. The pool keeps the context of each call and writes
  the task's remote stdout/stderr inside it (``context.run(on_output, ...)``), so it appears
  under the cell that ran the task, not under whichever cell happens to run when it arrives.
* ``destroy_at_kernel_exit()``: a kernel does not end like a script. Closing the notebook or
  restarting the kernel sends a shutdown request, and the frontend sends SIGTERM 2.5 seconds
  later and SIGKILL at 5 (jupyter_client's ``shutdown_wait_time``): too soon to destroy a
  stack from inside the kernel. So the first pool of a kernel starts a small detached process
  (``kernel_reaper``) that waits for the kernel to end, however it ends (shutdown, restart,
  crash, kill), and then destroys every stack the kernel still owned (a ``sky.Session``'s
  pools, or a ``with`` block that never got to exit).
"""

from __future__ import annotations

import contextvars
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

from skyward_iac.infra.stacks import home
from skyward_iac.infra.stacks.tags import process_started
from skyward_iac.observability.console import in_jupyter_kernel

log = logging.getLogger("skyward")

_reaper: subprocess.Popen[bytes] | None = None
_reaper_lock = threading.Lock()


def cell_context() -> contextvars.Context | None:
    """In a Jupyter kernel, a copy of the caller's context: write a task's remote output inside
    it (``context.run(on_output, node, stream, text)``) and it appears under the cell that
    submitted the task. None in any other process, so callers pay nothing there."""
    return contextvars.copy_context() if in_jupyter_kernel() else None


def destroy_at_kernel_exit() -> int | None:
    """In a Jupyter kernel, make sure its stacks are destroyed when the kernel ends.

    The first call starts the kernel's reaper (a detached process, in its own session so that
    neither an interrupt nor the kernel's shutdown reaches it); later calls find it running.
    Returns the reaper's pid, or None outside a kernel. Call it before the stack is created, so
    a kernel that dies during ``up`` is covered too.
    """
    global _reaper
    if not in_jupyter_kernel():
        return None
    with _reaper_lock:
        if _reaper is not None and _reaper.poll() is None:
            return _reaper.pid
        _reaper = _start_reaper(os.getpid())
        return _reaper.pid


def _start_reaper(pid: int) -> subprocess.Popen[bytes]:
    logs = home.skyward_home() / "logs"
    logs.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_file = logs / "kernel-reaper.log"
    # The reaper imports skyward_iac the way this kernel did, even from a checkout on sys.path.
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)}
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        reaper = subprocess.Popen(
            [sys.executable, "-m", "skyward_iac.orchestration.kernel_reaper", "--pid", str(pid),
             "--started", process_started(pid) or ""],
            stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, env=env, start_new_session=True,
        )
    finally:
        os.close(fd)
    log.info("kernel %d: its stacks will be destroyed when it ends (reaper pid %d, log %s)",
             pid, reaper.pid, log_file)
    return reaper
