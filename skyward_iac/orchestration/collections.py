"""Wiring a pool's collections: etcd on the head, a backend config for every node's workers,
and a backend for the client reached through an SSH tunnel to the head."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from skyward_iac.collections import Backend, BackendConfig, connect
from skyward_iac.outputs import ClusterOutputs
from skyward_iac.remote.bootstrap import ETCD_CLIENT_PORT, EtcdServerPlan

if TYPE_CHECKING:
    from skyward_iac.orchestration.node import Node

DISABLED = "collections are off for this pool (Options(cluster=False))"


def head_etcd_plan(outputs: ClusterOutputs) -> EtcdServerPlan | None:
    """What the head node's bootstrap needs to run etcd, or None without collections."""
    if outputs.etcd is None:
        return None
    return EtcdServerPlan(
        listen=outputs.node(0).private_address, ca_pem=outputs.etcd.ca_pem,
        cert_pem=outputs.etcd.server_cert_pem, key_pem=outputs.etcd.server_key_pem,
    )


#: How long a task's first collections call waits for the head's etcd (the pool may hand out
#: work before its head is ready, with ``Nodes.min``).
HEAD_WAIT = 600.0


def node_config(outputs: ClusterOutputs, job_id: str,
                ready_timeout: float = HEAD_WAIT) -> BackendConfig:
    """How tasks on every node reach the head's etcd: directly, over the private network."""
    if outputs.etcd is None:
        return BackendConfig.disabled(DISABLED, job_id)
    return BackendConfig(
        endpoints=(f"{outputs.node(0).private_address}:{ETCD_CLIENT_PORT}",), job_id=job_id,
        ca_pem=outputs.etcd.ca_pem, cert_pem=outputs.etcd.client_cert_pem,
        key_pem=outputs.etcd.client_key_pem, ready_timeout=ready_timeout,
    )


class ClientCollections:
    """The client's backend for ``pool.dict(...)`` and ``sky.dict(...)`` outside tasks.

    etcd listens only on the head's private address; the client gets there through an SSH
    direct-tcpip tunnel over the head's connection (the certificate names the server
    ``skyward-etcd``, so TLS holds through the tunnel). Opened on first use, once the head is in
    service (``head(timeout)`` waits for it: with ``Nodes.min`` the pool may be ready before
    its head), and opened again through a replacement head.
    """

    def __init__(self, outputs: ClusterOutputs, job_id: str,
                 head: Callable[[float], Node], timeout: float) -> None:
        self._outputs, self._job_id, self._head, self._timeout = outputs, job_id, head, timeout
        self._stack = contextlib.ExitStack()
        self._backend: Backend | None = None
        self._through: Node | None = None
        self._lock = threading.Lock()

    @property
    def backend(self) -> Backend:
        with self._lock:
            config = node_config(self._outputs, self._job_id)
            if config.disabled_reason is not None:
                if self._backend is None:
                    self._backend = connect(config)
                return self._backend
            head = self._head(self._timeout)
            if self._backend is None or head is not self._through:
                self._close()
                port = _free_local_port()
                self._stack.enter_context(head.connection.forward_local(
                    local_port=port, remote_port=ETCD_CLIENT_PORT,
                    remote_host=head.address.private_address, local_host="127.0.0.1",
                ))
                _wait_listening(port, self._timeout)
                self._backend = connect(BackendConfig(
                    endpoints=(f"127.0.0.1:{port}",), job_id=config.job_id,
                    ca_pem=config.ca_pem, cert_pem=config.cert_pem, key_pem=config.key_pem,
                ))
                self._through = head
            return self._backend

    def close(self) -> None:
        """Release the client's lease (its locks) and close the tunnel."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        backend, self._backend, self._through = self._backend, None, None
        try:
            if backend is not None:
                backend.close()
        finally:
            self._stack.close()
            self._stack = contextlib.ExitStack()


def _wait_listening(port: int, timeout: float) -> None:
    """Wait until the tunnel listens on ``port``: Fabric binds it in a thread of its own, after
    ``forward_local`` has returned, and a first call that comes too early is refused."""
    deadline = time.monotonic() + min(timeout, 30.0)
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise ConnectionError(f"the SSH tunnel to the head's etcd did not open port {port}")
        time.sleep(0.02)


def _free_local_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
