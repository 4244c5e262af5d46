"""The client's side of the dead-man switch: touch every node's heartbeat file over SFTP.

While it runs, nodes keep living; if this process dies or loses the network, every node stops
itself ``ttl`` seconds later (see remote/watchdog.py and the cloud-init watchdog).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from skyward_iac.orchestration.node import Node

log = logging.getLogger("skyward")


def beat_interval(ttl: int) -> float:
    """A third of the ttl (so two beats may be lost), between 0.5 and 30 seconds."""
    return min(30.0, max(0.5, ttl / 3))


class Heartbeat:
    """A daemon thread touching ``<workdir>/heartbeat`` on every node every ``beat_interval``."""

    def __init__(self, nodes: Sequence[Node], ttl: int) -> None:
        self.nodes = nodes
        self.interval = beat_interval(ttl)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="skyward-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self.interval):
            for node in self.nodes:
                try:
                    node.connection.sftp().utime(f"{node.address.workdir}/heartbeat", None)
                except Exception as exc:  # noqa: BLE001 - a lost node is noticed elsewhere
                    log.debug("heartbeat to node %s failed: %s", node.address.index, exc)

    def stop(self) -> None:
        """Stop beating (the stack is about to be destroyed, or the client is leaving)."""
        self._stopped.set()
        self._thread.join(timeout=5)
