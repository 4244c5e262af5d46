"""Local processes: liveness, and finding and stopping everything of a Local node's sandbox.

Shared by the Local node provider, the node's TTL watchdog and the etcd launcher; no Pulumi
here, because the watchdog runs on nodes.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

#: Set in every SSH session of a Local node (sshd SetEnv), so its processes can be found.
SANDBOX_ENV = "SKYWARD_LOCAL_SANDBOX"


def is_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie counts as dead (and is reaped if it is our child)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def sandbox_processes(sandbox: Path) -> list[int]:
    """Pids of every process of a sandbox: by cwd, command line or environment, plus their
    descendants."""
    marker = str(sandbox)
    # Compare whole path components: node-1 must not match node-10.
    in_cmdline, in_env = f"{marker}/".encode(), f"{SANDBOX_ENV}={marker}\0".encode()
    found: set[int] = set()
    parents: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cwd = os.readlink(proc / "cwd")
            if (
                cwd == marker
                or cwd.startswith(f"{marker}/")
                or in_cmdline in (proc / "cmdline").read_bytes()
                or in_env in (proc / "environ").read_bytes()
            ):
                found.add(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    # Descendants too: sshd's per-connection children rewrite their command line.
    grew = True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in found} - found
        found |= children
        grew = bool(children)
    return sorted(pid for pid in found if is_alive(pid))


def stop_sandbox(sandbox: Path, grace: float = 5.0) -> None:
    """Stop every process of a sandbox (TERM, then KILL after ``grace``) and remove it."""
    pids = sandbox_processes(sandbox)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 2.0)
        while time.monotonic() < deadline and (pids := [p for p in pids if is_alive(p)]):
            time.sleep(0.05)
        if not pids:
            break
    shutil.rmtree(sandbox, ignore_errors=True)
    try:
        sandbox.parent.rmdir()  # the stack's directory, once its last node is gone
    except OSError:
        pass
