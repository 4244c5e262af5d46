"""A node's SSH connection, opened when needed.

SSH is how a node is bootstrapped, and its fallback tunnel to the agent; once a node's agent
is reached over its data port, nothing else needs the connection for the pool's life, and
holding it costs a paramiko transport thread per node. ``NodeSsh`` keeps the connection a
node was started with until ``release()``, and reconnects (the same pinned host key and stack
key, ``ssh.connect``) when something asks for it again: a fence, the volumes' unmount, a
forwarded port. After ``close()`` it never connects again, so nothing reconnects to a node
its pool has let go.

``held`` is the connection open now, never a new one: what a lifeline is judged by (the head's
collections tunnel, its SFTP beats before the agent carries them).
"""

from __future__ import annotations

import threading
from typing import Any

import fabric
import paramiko

from skyward_iac.api.errors import NodeConnectionError
from skyward_iac.outputs import NodeAddress
from skyward_iac.remote import ssh


class NodeSsh:
    """One node's SSH connection: held, released, or opened again on demand."""

    def __init__(self, address: NodeAddress, private_key_pem: str, timeout: float,
                 retry_interval: float, connection: fabric.Connection) -> None:
        self.address = address
        self._key = private_key_pem
        self._timeout, self._retry_interval = timeout, retry_interval
        self._connection: fabric.Connection | None = connection
        self._closed = False
        self._lock = threading.Lock()

    @property
    def held(self) -> fabric.Connection | None:
        """The connection open now (None: released, closed or broken); never a new one."""
        connection = self._connection
        if connection is None or not connection.is_connected:
            return None
        return connection

    @property
    def held_transport(self) -> paramiko.Transport | None:
        """The transport of the connection open now (None: none); never a new one."""
        held = self.held
        return held.transport if held is not None else None

    @property
    def client(self) -> paramiko.SSHClient:
        """The held connection's paramiko client (for SFTP beats); ``NodeConnectionError``
        when none is held (a beat over a broken connection fails, as it did)."""
        held = self.held
        if held is None:
            raise NodeConnectionError(f"node {self.address.index}: no SSH connection is open")
        return held.client

    def open(self) -> fabric.Connection:
        """The connection, opened again when it was released or broke (``NodeConnectionError``
        when the node cannot be reached within the timeout, or after ``close``)."""
        with self._lock:
            if self._closed:
                raise NodeConnectionError(f"node {self.address.index}: its SSH connection "
                                          "was closed with the node")
            held = self.held
            if held is not None:
                return held
            if self._connection is not None:
                self._connection.close()
            self._connection = ssh.connect(self.address, self._key, self._timeout,
                                           retry_interval=self._retry_interval)
            return self._connection

    @property
    def transport(self) -> paramiko.Transport:
        """The connection's transport, connecting when needed (forwarded ports, tunnels)."""
        return self.open().transport

    def run(self, command: str, **kwargs: Any) -> Any:
        """``fabric.Connection.run`` over the connection, connecting when needed."""
        return self.open().run(command, **kwargs)

    def release(self) -> None:
        """Close the connection now; the next use opens it again."""
        with self._lock:
            connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def close(self) -> None:
        """Close the connection for good (idempotent)."""
        with self._lock:
            self._closed = True
            connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
