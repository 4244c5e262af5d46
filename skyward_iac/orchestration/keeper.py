"""The keeper of a warm pool: a small detached process that keeps idle nodes for their next user.

Started by a pool that closes with ``Options(keep_warm=...)`` (``start_keeper``), it reads the
pool's handover on stdin, heartbeats every node over SSH as the client did, lists itself in
the warm registry and waits on its Unix socket. The first adopter whose claim it accepts gets
the pool; once the adopter says its own heartbeats run, the keeper stops and exits. If nobody
claims the pool before ``keep_warm`` runs out, the keeper destroys the stack. If the keeper
itself dies, the nodes stop themselves after ``ttl`` and gc empties the stack, as for any
client that died.

Run as ``python -m skyward_iac.orchestration.keeper`` with the handover JSON on stdin.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from skyward_iac.api.deadlines import warm_until
from skyward_iac.infra.stacks import home, leases
from skyward_iac.orchestration import warm
from skyward_iac.orchestration.heartbeat import Heartbeat
from skyward_iac.orchestration.identity import PoolIdentity
from skyward_iac.remote import ssh

log = logging.getLogger("skyward.keeper")
#: How long the keeper's destroy waits for another update's lock on the stack (a gc run).
DESTROY_PATIENCE = 120.0


def start_keeper(pool: warm.WarmPool, key: str, keep_warm: float, ttl: int,
                 ssh_timeout: float) -> subprocess.Popen[bytes]:
    """Start the keeper of ``pool`` for ``keep_warm`` seconds. The handover (secrets included)
    goes through a pipe, never the command line."""
    logs = home.skyward_home() / "logs"
    logs.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(logs / f"keeper-{pool.stack}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                 0o600)
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)}
    try:
        keeper = subprocess.Popen(
            [sys.executable, "-m", "skyward_iac.orchestration.keeper"],
            stdin=subprocess.PIPE, stdout=fd, stderr=fd, env=env, start_new_session=True)
    finally:
        os.close(fd)
    assert keeper.stdin is not None
    keeper.stdin.write(json.dumps({
        "pool": pool.to_json(), "key": key, "until": warm_until(time.time(), keep_warm),
        "keep_warm": keep_warm, "ttl": ttl, "ssh_timeout": ssh_timeout}).encode())
    keeper.stdin.close()
    return keeper


class Keeper:
    """Keeps one warm pool (see the module doc)."""

    def __init__(self, handover: dict[str, Any]) -> None:
        self.pool = warm.WarmPool.from_json(handover["pool"])
        self.key = str(handover["key"])
        self.until = float(handover["until"])
        self.keep_warm = float(handover["keep_warm"])
        self.ttl = int(handover["ttl"])
        self.ssh_timeout = float(handover["ssh_timeout"])
        self.socket_path = warm.socket_path(self.pool.stack)
        self.entry = warm.registry_dir(self.key) / f"{self.pool.stack}.json"
        self.lost = threading.Event()
        self.heartbeat: Heartbeat | None = None
        self.connections: list[Any] = []

    def run(self) -> None:
        # Held on this machine while kept: gc here sees a live holder, not a dead owner.
        held = leases.hold(self.pool.stack)
        try:
            self._keep()
        finally:
            leases.release(held)

    def _keep(self) -> None:
        stack = self.pool.stack
        if self.ttl:
            self.heartbeat = Heartbeat(self.ttl, self._silent, PoolIdentity(stack))
        for address in self.pool.outputs.nodes:
            connection = ssh.connect(address, self.pool.outputs.ssh_private_key,
                                     self.ssh_timeout)
            self.connections.append(connection)
            if self.heartbeat is not None:
                self.heartbeat.add(address.index, connection, address.workdir)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket_path.unlink(missing_ok=True)
        server.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o600)
        server.listen(4)
        self._list(True)
        # A listing detail only: it must not keep a claim waiting.
        threading.Thread(target=self._tag, daemon=True, args=(
            datetime.fromtimestamp(self.until, UTC).isoformat(timespec="seconds"),)).start()
        log.info("keeping %s warm until %s", stack, time.ctime(self.until))
        adopted = False
        try:
            while not adopted and not self.lost.is_set():
                left = self.until - time.time()
                if left <= 0:
                    break
                server.settimeout(min(left, 1.0))
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                adopted = self._serve(conn)
        finally:
            self._list(False)
            server.close()
            self.socket_path.unlink(missing_ok=True)
            self._stop_beating()
        if adopted:
            log.info("%s adopted", stack)
            return
        why = ("a node was lost" if self.lost.is_set()
               else f"unclaimed for {self.keep_warm:g}s")
        self._destroy(why)

    def _serve(self, conn: socket.socket) -> bool:
        """One adopter: True once it has taken the pool."""
        with conn:
            conn.settimeout(30)
            try:
                if warm.peer_uid(conn) != os.getuid():
                    return False  # only the pool's own user may have its keys
                request = warm.receive(conn)
                if request.get("claim") != self.key or self.lost.is_set():
                    warm.send(conn, {"ok": False, "why": "another pool"})
                    return False
                warm.send(conn, {"ok": True, "pool": self.pool.to_json()})
                answer = warm.receive(conn)
                if not answer.get("adopted"):
                    return False
                self._stop_beating()  # the adopter beats now
                warm.send(conn, {"bye": True})
                return True
            except (OSError, ValueError, ConnectionError) as exc:
                log.warning("a claim failed: %s", exc)
                return False

    def _silent(self, index: int, reason: str) -> None:
        log.error("node %d is gone (%s): the pool is no longer worth keeping", index, reason)
        self.lost.set()

    def _stop_beating(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None
        for connection in self.connections:
            connection.close()
        self.connections = []

    def _list(self, listed: bool) -> None:
        if not listed:
            self.entry.unlink(missing_ok=True)
            return
        tmp = self.entry.with_suffix(".tmp")
        tmp.write_text(json.dumps({"stack": self.pool.stack, "socket": str(self.socket_path),
                                   "pid": os.getpid(), "since": time.time(),
                                   "until": self.until}))
        tmp.replace(self.entry)

    def _tag(self, until: str) -> None:
        from skyward_iac.infra.stacks.stack import ClusterStack

        try:
            ClusterStack.select(self.pool.stack).set_warm(until)
        except Exception as exc:  # noqa: BLE001 - a listing detail only
            log.warning("tagging %s warm failed: %s", self.pool.stack, exc)

    def _destroy(self, why: str) -> None:
        """Destroy the stack through the one destroy path, as the process that holds it."""
        from skyward_iac.infra.stacks import destroy
        from skyward_iac.infra.stacks.stack import ClusterStack

        log.info("destroying %s: %s", self.pool.stack, why)
        stack = ClusterStack.select(self.pool.stack)
        stack.set_warm(None)
        outcome = destroy.destroy(stack, destroy.Destroyer(
            destroy.KEEPER, f"warm pool {why}", holds=True, patience=DESTROY_PATIENCE))
        if outcome.error is not None:
            log.error("destroying %s failed (gc collects it once its nodes stopped): %s",
                      self.pool.stack, outcome.detail)
            return
        log.info("%s destroyed", self.pool.stack)


def main(argv: Sequence[str] | None = None) -> None:
    """Keep the pool the handover on stdin describes (it takes no arguments)."""
    argparse.ArgumentParser(prog="python -m skyward_iac.orchestration.keeper",
                            description="the keeper of a warm pool; the handover JSON on stdin"
                            ).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    Keeper(json.loads(sys.stdin.read())).run()


if __name__ == "__main__":
    sys.exit(main())
