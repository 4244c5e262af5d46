"""Local processes: liveness, and finding and stopping everything of a Local node's sandbox.

A Local node's processes are found two ways. Where the system has a writable cgroup v2
hierarchy (root, or a delegated subtree), each node gets a cgroup of its own that its sshd is
started in, so every process a session starts belongs to it, even one that double-forks with
``setsid`` and leaves the sandbox; ``cgroup.kill`` stops them all at once. Everywhere, and for
what runs outside the cgroup (the node's watchdog), processes are also found by their working
directory, command line or environment (``SANDBOX_ENV``) and their descendants.

Shared by the Local node provider, the node's TTL watchdog and the etcd launcher; no Pulumi
here, because the watchdog runs on nodes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
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


#: Where a sandbox records the cgroup its processes run in.
CGROUP_FILE = "run/cgroup"


def cgroup2_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup`` or, on hybrid systems,
    ``/sys/fs/cgroup/unified``), or None."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def create_sandbox_cgroup(sandbox: Path) -> Path | None:
    """A new cgroup for the processes of ``sandbox`` (recorded in it), or None when there is no
    cgroup v2 hierarchy this user may write or it lacks ``cgroup.kill`` (Linux < 5.14)."""
    mount = cgroup2_mount()
    if mount is None:
        return None
    digest = hashlib.sha256(str(sandbox).encode()).hexdigest()[:10]
    group = mount / "skyward" / f"{sandbox.parent.name}.{sandbox.name}.{digest}"
    try:
        group.mkdir(parents=True, exist_ok=True)
        if not (group / "cgroup.kill").exists() or not os.access(group / "cgroup.procs", os.W_OK):
            group.rmdir()
            return None
    except OSError:
        return None
    (sandbox / CGROUP_FILE).write_text(str(group))
    return group


def sandbox_cgroup(sandbox: Path) -> Path | None:
    """The cgroup a sandbox's processes run in, if it has one."""
    try:
        group = Path((sandbox / CGROUP_FILE).read_text().strip())
    except OSError:
        return None
    return group if (group / "cgroup.procs").exists() else None


def cgroup_populated(group: Path) -> bool:
    """Whether any process runs in ``group`` (or a cgroup below it)."""
    try:
        return "populated 1" in (group / "cgroup.events").read_text()
    except OSError:
        return False


def kill_cgroup(group: Path, wait: float = 5.0) -> bool:
    """SIGKILL every process of ``group`` and remove it once empty; True when it is gone."""
    try:
        (group / "cgroup.kill").write_text("1")
    except OSError:
        return not group.exists()
    deadline = time.monotonic() + wait
    while cgroup_populated(group) and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        group.rmdir()
    except OSError:
        return False
    return True


def sandbox_running(sandbox: Path) -> bool:
    """Whether anything of the node still runs: its cgroup is populated or, without one, a
    process other than its watchdog is found in it."""
    group = sandbox_cgroup(sandbox)
    if group is not None:
        return cgroup_populated(group)
    watchdog = _read_pid(sandbox / "run" / "watchdog.pid")
    return any(pid != watchdog for pid in sandbox_processes(sandbox))


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


#: The label on a node's container (``remote/container.py``): the node's workdir.
CONTAINER_LABEL = "skyward-iac.workdir"


def remove_containers(sandbox: Path) -> list[str]:
    """Remove the Docker containers of nodes whose workdir is inside ``sandbox`` (a Local
    node's ``container_image``: Docker's processes live outside the sandbox's cgroup).
    Returns their ids; a machine without Docker has none."""
    if shutil.which("docker") is None:
        return []
    try:
        listed = subprocess.run(
            ["docker", "ps", "-a", "--filter", f"label={CONTAINER_LABEL}", "--format",
             f'{{{{.ID}}}} {{{{index .Labels "{CONTAINER_LABEL}"}}}}'],
            capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    root = str(sandbox).rstrip("/") + "/"
    ids = [cid for cid, _, workdir in (line.partition(" ") for line in listed.stdout.splitlines())
           if (workdir.rstrip("/") + "/").startswith(root)]
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, timeout=60, check=False)
    return ids


def stop_sandbox(sandbox: Path, grace: float = 5.0) -> None:
    """Stop every process of a sandbox and remove it: its containers are removed and its
    cgroup killed at once, the processes found by scanning get TERM, then KILL after
    ``grace``."""
    remove_containers(sandbox)
    group = sandbox_cgroup(sandbox)
    if group is not None:
        kill_cgroup(group)
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
