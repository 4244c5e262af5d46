"""The Local provider's one resource: a node made of a sandbox, a loopback address and an sshd.

A node's life is its processes': its sshd starts in a cgroup of its own where the system allows
(``processes.create_sandbox_cgroup``), so everything its sessions start is in it; it counts as
alive while anything of it runs, and deleting it stops all of it. Its TTL watchdog starts with
it (not at bootstrap), so a client killed during ``up`` still leaves nodes that stop by
themselves: until the first beat it allows ``sky.Local(first_contact_grace)`` seconds
(``FIRST_CONTACT_GRACE`` by default) or the ttl, whichever is longer, the time the client has
to reach the node and start beating.

This module is referenced by pickled providers in existing stacks: do not move or rename
``LocalNodeProvider`` (it moved once, from infra/local_node.py: the provider host aliases that
path, ``infra/engine/provider_host.py``).
"""

from __future__ import annotations

import errno
import getpass
import os
import random
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import (
    CreateResult,
    DiffResult,
    ReadResult,
    Resource,
    ResourceProvider,
    UpdateResult,
)

from skyward_iac.infra.identity.keys import generate_keypair
from skyward_iac.node import command as node_command
from skyward_iac.processes import (
    SANDBOX_ENV,
    create_sandbox_cgroup,
    is_alive,
    sandbox_running,
    stop_sandbox,
)

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")
#: At least this many seconds (and at least its ttl) a new node waits for its client's first
#: heartbeat, on top of its ttl: the rest of the ``up`` and the first SSH connection. The
#: default of ``sky.Local(first_contact_grace)``; a stack made before that field was read has
#: no ``first_contact`` input and gets this.
FIRST_CONTACT_GRACE = 30.0


def sshd_binary() -> str:
    """Path of OpenSSH's sshd, or a RuntimeError saying how to install it."""
    for candidate in (shutil.which("sshd"), *SSHD_CANDIDATES):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError("sshd not found: install openssh-server (scripts/setup does it)")


def _free_address(port: int | None) -> tuple[str, int]:
    """A loopback address (and port) nobody listens on, picked at random in 127.64.0.0/10."""
    rng = random.SystemRandom()
    for _ in range(200):
        address = f"127.{rng.randint(64, 127)}.{rng.randint(0, 255)}.{rng.randint(2, 254)}"
        with socket.socket() as probe:
            try:
                probe.bind((address, port or 0))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    continue
                raise
            return address, probe.getsockname()[1]
    raise RuntimeError("no free loopback address found")


def _sshd_config(sandbox: Path, address: str, port: int, user: str) -> str:
    return "\n".join([
        f"ListenAddress {address}:{port}",
        f"HostKey {sandbox}/etc/ssh_host_ed25519_key",
        f"PidFile {sandbox}/run/sshd.pid",
        f"AuthorizedKeysFile {sandbox}/etc/authorized_keys",
        f"AllowUsers {user}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        # The sandbox lives under the user's home or /tmp; sshd's ownership checks would refuse it.
        "StrictModes no",
        "AllowTcpForwarding local",
        "AllowAgentForwarding no",
        "X11Forwarding no",
        "PermitTunnel no",
        "PrintMotd no",
        "PrintLastLog no",
        "MaxSessions 64",
        "MaxStartups 64:30:128",
        "ClientAliveInterval 15",
        # SHLVL=1: bash run by sshd reads the user's ~/.bashrc only as a first-level shell, so
        # a node's commands never wait on what the user's shell start-up does (a pyenv
        # rehash waiting 60 s on a stale lock made every command of every node wait).
        f"SetEnv {SANDBOX_ENV}={sandbox} SHLVL=1",
        "Subsystem sftp internal-sftp",
        "LogLevel INFO",
        "",
    ])


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _wait_listening(address: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((address, port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class LocalNodeProvider(ResourceProvider):
    """CRUD for one Local node: a directory, a loopback address and a detached OpenSSH sshd."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        sandbox = Path(props["sandbox_root"]) / props["stack"] / f"node-{int(props['index'])}"
        if sandbox.exists():
            stop_sandbox(sandbox)
        for sub in ("etc", "run", "log", "work"):
            (sandbox / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        # Which backend's stack owns it (the engine that runs this provider says): gc treats
        # it as an orphan only when that backend no longer has the stack.
        (sandbox / BACKEND_FILE).write_text(os.environ.get("PULUMI_BACKEND_URL", ""))
        user = props.get("user") or getpass.getuser()
        address, port = _free_address(22 if os.geteuid() == 0 else None)
        host_key = generate_keypair(f"skyward-{props['stack']}-node-{int(props['index'])}")
        _write(sandbox / "etc" / "ssh_host_ed25519_key", host_key.private_pem, 0o600)
        _write(sandbox / "etc" / "authorized_keys", props["authorized_key"] + "\n", 0o600)
        _write(sandbox / "etc" / "sshd_config", _sshd_config(sandbox, address, port, user), 0o600)
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege-separation dir
        # sshd daemonizes itself (double fork, new session), so it outlives this provider process.
        started = subprocess.run(
            _in_cgroup(create_sandbox_cgroup(sandbox),
                       [sshd_binary(), "-f", str(sandbox / "etc" / "sshd_config"),
                        "-E", str(sandbox / "log" / "sshd.log")]),
            check=False, capture_output=True, text=True, timeout=30,
        )
        if started.returncode != 0:
            log = (sandbox / "log" / "sshd.log").read_text(errors="replace")[-2000:]
            stop_sandbox(sandbox)
            raise RuntimeError(f"sshd failed to start ({started.returncode}): {started.stderr}{log}")
        try:
            _wait_listening(address, port, timeout=10)
        except OSError as exc:
            stop_sandbox(sandbox)
            raise RuntimeError(f"sshd of {sandbox.name} never listened on {address}:{port}") from exc
        if int(props.get("ttl") or 0) > 0 or props.get("max_lifetime"):
            _start_watchdog(sandbox, int(props.get("ttl") or 0), props.get("max_lifetime"),
                            float(props.get("first_contact") or FIRST_CONTACT_GRACE))
        outs = {
            **props,
            "user": user,
            "address": address,
            "port": port,
            "host_key": host_key.public,
            "sandbox": str(sandbox),
            "workdir": str(sandbox / "work"),
            "sshd_pid": _read_pid(sandbox / "run" / "sshd.pid") or 0,
        }
        return CreateResult(id_=f"{props['stack']}/node-{int(props['index'])}", outs=outs)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        if not props.get("sandbox"):
            return ReadResult(id_=None, outs={})
        sandbox = Path(props["sandbox"])
        pid = _read_pid(sandbox / "run" / "sshd.pid")
        if (pid is None or not is_alive(pid)) and not sandbox_running(sandbox):
            return ReadResult(id_=None, outs={})  # nothing of it runs: a refresh drops it
        # Alive while any of its processes is (its sshd may have died under its agent): kept in
        # the stack, so that deleting or replacing it stops them.
        return ReadResult(id_=id_, outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [k for k in ("stack", "index", "sandbox_root", "user") if olds.get(k) != news.get(k)]
        changes = replaces + (["authorized_key"] if olds.get("authorized_key") != news.get("authorized_key") else [])
        return DiffResult(changes=bool(changes), replaces=replaces, delete_before_replace=True)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        # Only the authorized key changes in place; sshd reads the file on every login.
        _write(Path(olds["sandbox"]) / "etc" / "authorized_keys", news["authorized_key"] + "\n", 0o600)
        return UpdateResult(outs={**olds, "authorized_key": news["authorized_key"]})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        if props.get("sandbox"):
            stop_sandbox(Path(props["sandbox"]))


def sandbox_dirs(root: Path) -> list[Path]:
    """Every node sandbox under ``root`` (``<root>/<stack>/node-N``)."""
    if not root.is_dir():
        return []
    return sorted(node for stack in root.iterdir() if stack.is_dir()
                  for node in stack.glob("node-*") if node.is_dir())


#: Where a sandbox records the backend its stack lives in.
BACKEND_FILE = "run/backend"


def orphan_sandboxes(sandboxes: Iterable[Path], stacks: Iterable[str],
                     backend: str) -> list[Path]:
    """The ``sandboxes`` of ``backend`` whose stack is not among ``stacks`` (that backend's):
    what a node dropped from a lost state left running. A sandbox of another backend is never
    one. List the sandboxes before the stacks (see ``gc.collect``)."""
    known = set(stacks)

    def recorded(node: Path) -> str | None:
        try:
            return (node / BACKEND_FILE).read_text().strip()
        except OSError:
            return None

    return [node for node in sandboxes
            if node.parent.name not in known and recorded(node) == backend]


def _in_cgroup(group: Path | None, command: list[str]) -> list[str]:
    """``command`` run from inside ``group`` (a shell joins it, then execs the command)."""
    if group is None:
        return command
    procs = shlex.quote(str(group / "cgroup.procs"))
    return ["/bin/sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *command]


def _start_watchdog(sandbox: Path, ttl: int, max_lifetime: int | None = None,
                    first_contact: float = FIRST_CONTACT_GRACE) -> None:
    """Start the node's dead-man switch now, outside its cgroup (stopping the node must not
    stop it first), allowing the first-contact grace before the first beat."""
    heartbeat = sandbox / "work" / "heartbeat"
    heartbeat.touch()
    with open(sandbox / "log" / "watchdog.log", "ab") as log:
        watchdog = subprocess.Popen(
            node_command("watchdog", "--heartbeat", str(heartbeat), "--ttl", str(ttl),
                         "--sandbox", str(sandbox), "--first-contact", f"{first_contact:g}",
                         *(["--max-lifetime", str(max_lifetime)] if max_lifetime else [])),
            cwd=sandbox, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    (sandbox / "run" / "watchdog.pid").write_text(str(watchdog.pid))


def _write(path: Path, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as file:
        file.write(text)
    os.chmod(path, mode)


class LocalNode(Resource, module="skyward", name="LocalNode"):
    """A Local node in a stack; outputs address, port, user, host_key, workdir, sandbox."""

    address: pulumi.Output[str]
    port: pulumi.Output[int]
    user: pulumi.Output[str]
    host_key: pulumi.Output[str]
    workdir: pulumi.Output[str]
    sandbox: pulumi.Output[str]
    sshd_pid: pulumi.Output[int]

    def __init__(
        self, name: str, *, stack: str, index: int, authorized_key: pulumi.Input[str],
        sandbox_root: str, ttl: int = 0, max_lifetime: int | None = None,
        first_contact: float = FIRST_CONTACT_GRACE, opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "stack": stack, "index": index, "authorized_key": authorized_key,
            "sandbox_root": sandbox_root, "user": getpass.getuser(), "ttl": ttl,
            "max_lifetime": max_lifetime, "first_contact": first_contact,
            "address": None, "port": None, "host_key": None, "workdir": None,
            "sandbox": None, "sshd_pid": None,
        }
        super().__init__(LocalNodeProvider(), name, props, opts)
