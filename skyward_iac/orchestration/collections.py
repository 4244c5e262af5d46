"""Wiring a pool's collections: etcd on the head, a backend config for every node's workers,
and a backend for the client reached through an SSH tunnel to the head."""

from __future__ import annotations

import contextlib
import socket

import fabric

from skyward_iac.collections import Backend, BackendConfig, connect
from skyward_iac.infra.stack import ClusterOutputs
from skyward_iac.remote.bootstrap import ETCD_CLIENT_PORT, EtcdServerPlan

DISABLED = "collections are off for this pool (Options(cluster=False))"


def head_etcd_plan(outputs: ClusterOutputs) -> EtcdServerPlan | None:
    """What the head node's bootstrap needs to run etcd, or None without collections."""
    if outputs.etcd is None:
        return None
    return EtcdServerPlan(
        listen=outputs.nodes[0].private_address, ca_pem=outputs.etcd.ca_pem,
        cert_pem=outputs.etcd.server_cert_pem, key_pem=outputs.etcd.server_key_pem,
    )


def node_config(outputs: ClusterOutputs, job_id: str) -> BackendConfig:
    """How tasks on every node reach the head's etcd: directly, over the private network."""
    if outputs.etcd is None:
        return BackendConfig.disabled(DISABLED, job_id)
    return BackendConfig(
        endpoints=(f"{outputs.nodes[0].private_address}:{ETCD_CLIENT_PORT}",), job_id=job_id,
        ca_pem=outputs.etcd.ca_pem, cert_pem=outputs.etcd.client_cert_pem,
        key_pem=outputs.etcd.client_key_pem,
    )


class ClientCollections:
    """The client's backend for ``pool.dict(...)`` and ``sky.dict(...)`` outside tasks.

    etcd listens only on the head's private address; the client gets there through an SSH
    direct-tcpip tunnel over the head's existing connection (the certificate names the server
    ``skyward-etcd``, so TLS holds through the tunnel). Opened on first use.
    """

    def __init__(self, outputs: ClusterOutputs, job_id: str, head: fabric.Connection) -> None:
        self._outputs, self._job_id, self._head = outputs, job_id, head
        self._stack = contextlib.ExitStack()
        self._backend: Backend | None = None

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            config = node_config(self._outputs, self._job_id)
            if config.disabled_reason is None:
                port = _free_local_port()
                self._stack.enter_context(self._head.forward_local(
                    local_port=port, remote_port=ETCD_CLIENT_PORT,
                    remote_host=self._outputs.nodes[0].private_address, local_host="127.0.0.1",
                ))
                config = BackendConfig(
                    endpoints=(f"127.0.0.1:{port}",), job_id=config.job_id, ca_pem=config.ca_pem,
                    cert_pem=config.cert_pem, key_pem=config.key_pem,
                )
            self._backend = connect(config)
        return self._backend

    def close(self) -> None:
        """Release the client's lease (its locks) and close the tunnel."""
        if self._backend is not None:
            self._backend.close()
            self._backend = None
        self._stack.close()


def _free_local_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
