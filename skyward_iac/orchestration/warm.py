"""Warm pools: nodes that outlive their ``with`` block, kept for the next equal pool.

With ``Options(keep_warm=seconds)``, a pool that closes cleanly leaves its nodes running,
idle, and hands them to a *keeper* (``keeper.py``), a small detached process that heartbeats
them, listens for an adopter and destroys the stack when nobody claimed it in time. A later
``Compute`` of the same user on this machine whose pool has the same ``warm_key`` (spec,
image, plugins, worker, skyward's own code and Python) claims it from the keeper and is in
service as soon as it has reconnected to the nodes' agents: no stack update, no bootstrap.

The keeper and its adopters talk over a Unix socket in a directory only this user can enter
(``runtime_dir``), and each side checks the other's uid (``SO_PEERCRED``), because the claim
hands over the stack's SSH key and agent token. One claim at a time: the keeper serves claims
in turn and gives its pool to the first.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from skyward_iac.infra.stacks import home
from skyward_iac.outputs import ClusterOutputs, EtcdMaterial, NodeAddress

#: How long an adopter waits for a keeper's answer.
CLAIM_TIMEOUT = 5.0


def warm_key(parts: dict[str, Any]) -> str:
    """A pool's fingerprint: equal for two pools whose nodes are interchangeable."""
    blob = json.dumps(parts, sort_keys=True, default=repr).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def package_digest() -> str:
    """A digest of skyward_iac's own source: a warm node runs the code it was given."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    digest.update(sys.version.encode())
    return digest.hexdigest()[:24]


def runtime_dir() -> Path:
    """A short directory only this user can enter, for the keepers' sockets (a Unix socket
    path must stay under 108 bytes, which a deep ``$SKYWARD_HOME`` would not)."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    path = base / f"skyward-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.lstat()
    if info.st_uid != os.getuid() or (info.st_mode & 0o077) or path.is_symlink():
        raise PermissionError(f"{path} is not a private directory of this user; remove it")
    return path


def registry_dir(key: str) -> Path:
    """Where the warm pools of ``key`` are listed (one JSON file per keeper)."""
    path = home.skyward_home() / "warm" / key
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def socket_path(stack: str) -> Path:
    """The keeper socket of ``stack`` (named by a digest of this home and the stack)."""
    name = hashlib.sha256(f"{home.skyward_home()}:{stack}".encode()).hexdigest()[:20]
    return runtime_dir() / f"{name}.sock"


@dataclass(frozen=True)
class WarmPool:
    """What a keeper hands its adopter: the stack, its outputs and each node's agent port."""

    stack: str
    outputs: ClusterOutputs
    ports: dict[int, int]
    #: The request in force when the pool went warm: node count, nodes moved on demand.
    node_count: int
    on_demand_nodes: tuple[int, ...] = ()
    #: When the stack's first pool started and when it went warm, on this machine's wall
    #: clock (a keeper and its adopters run on one machine), and what it had cost by then:
    #: an adopter reports the stack's whole life, not only its own part of it.
    up_since: float = 0.0
    warm_since: float = 0.0
    spent_usd: float = 0.0

    def age(self, now: float) -> float:
        """Seconds since the stack's first pool started (0 when a keeper did not say)."""
        return max(0.0, now - self.up_since) if self.up_since else 0.0

    def cost_at(self, now: float, usd_per_hour: float) -> float:
        """USD the stack has cost by ``now``: until it went warm, then idle at the rate."""
        idle = max(0.0, now - self.warm_since) if self.warm_since else 0.0
        return self.spent_usd + usd_per_hour * idle / 3600

    def to_json(self) -> dict[str, Any]:
        out = self.outputs
        return {
            "stack": self.stack, "ports": {str(k): v for k, v in self.ports.items()},
            "node_count": self.node_count, "on_demand_nodes": list(self.on_demand_nodes),
            "up_since": self.up_since, "warm_since": self.warm_since,
            "spent_usd": self.spent_usd,
            "outputs": {"nodes": [asdict(n) for n in out.nodes],
                        "ssh_private_key": out.ssh_private_key,
                        "agent_token": out.agent_token,
                        "etcd": asdict(out.etcd) if out.etcd is not None else None,
                        "pki": asdict(out.pki) if out.pki is not None else None},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WarmPool:
        out = data["outputs"]
        outputs = ClusterOutputs(
            nodes=tuple(NodeAddress(**n) for n in out["nodes"]),
            ssh_private_key=out["ssh_private_key"], agent_token=out["agent_token"],
            etcd=EtcdMaterial(**out["etcd"]) if out["etcd"] else None,
            pki=EtcdMaterial(**out["pki"]) if out.get("pki") else None)
        return cls(data["stack"], outputs, {int(k): v for k, v in data["ports"].items()},
                   data["node_count"], tuple(data["on_demand_nodes"]),
                   data.get("up_since", 0.0), data.get("warm_since", 0.0),
                   data.get("spent_usd", 0.0))

    def __repr__(self) -> str:  # the secrets never reach a log line
        return f"WarmPool({self.stack!r}, nodes={self.node_count})"


# ---- the wire between a keeper and an adopter (one JSON message per frame) -------------------

def send(sock: socket.socket, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def receive(sock: socket.socket, limit: int = 1 << 20) -> dict[str, Any]:
    (size,) = struct.unpack("!I", _exactly(sock, 4))
    if size > limit:
        raise ValueError(f"a {size}-byte message is too large")
    return dict(json.loads(_exactly(sock, size)))


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


# ---- adopting -------------------------------------------------------------------------------

class Claim:
    """A warm pool claimed from its keeper; ``confirm()`` once the adopter's own heartbeats
    run (the keeper then stops and exits), ``release()`` to give it back."""

    def __init__(self, sock: socket.socket, pool: WarmPool) -> None:
        self._sock = sock
        self.pool = pool

    def confirm(self) -> None:
        self._finish(True)

    def release(self) -> None:
        self._finish(False)

    def _finish(self, adopted: bool) -> None:
        try:
            send(self._sock, {"adopted": adopted})
            receive(self._sock)  # the keeper's goodbye: it has stopped beating
        except (OSError, ValueError, ConnectionError):
            pass
        finally:
            self._sock.close()


def listed(key: str) -> Iterator[tuple[Path, dict[str, Any]]]:
    """The registry entries of warm pools for ``key``, oldest first."""
    entries = []
    for path in registry_dir(key).glob("*.json"):
        try:
            entries.append((path, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue
    yield from sorted(entries, key=lambda entry: entry[1].get("since", 0))


def claim(key: str) -> Claim | None:
    """Claim a warm pool for ``key`` from its keeper, or None when there is none to have."""
    for path, entry in listed(key):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CLAIM_TIMEOUT)
        try:
            sock.connect(entry["socket"])
            if peer_uid(sock) != os.getuid():
                raise PermissionError("the keeper's socket belongs to another user")
            send(sock, {"claim": key})
            answer = receive(sock)
        except (OSError, ValueError, ConnectionError, KeyError):
            sock.close()
            if not _keeper_alive(entry):
                path.unlink(missing_ok=True)  # its keeper is gone: the entry is stale
            continue
        if not answer.get("ok"):
            sock.close()
            continue
        return Claim(sock, WarmPool.from_json(answer["pool"]))
    return None


def wait_listed(key: str, stack: str, keeper: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait until ``keeper`` keeps ``stack`` (it lists itself once it beats every node and
    listens); False if it exits or takes longer than ``timeout``."""
    entry = registry_dir(key) / f"{stack}.json"
    deadline = time.monotonic() + timeout
    while not entry.exists():
        if keeper.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _keeper_alive(entry: dict[str, Any]) -> bool:
    try:
        os.kill(int(entry.get("pid", 0)), 0)
    except (OSError, ValueError):
        return False
    return True
