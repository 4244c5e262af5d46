"""A connection to one job's collections: what a pool, an agent or a task process holds.

A :class:`Backend` is built from a :class:`BackendConfig` (endpoints, job id, the stack's CA
and a client certificate) by :func:`connect`. The config is a small frozen, picklable value:
the worker hands it to every child process of the process executor, and the child calls
``connect(config)`` (then ``context.bind`` or ``context.set_process_default``) to get its own
backend. gRPC channels, watch streams and lease threads never cross a process boundary.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import threading
import time
from dataclasses import dataclass, field

from skyward_iac.api.errors import CollectionError, CollectionsDisabledError
from skyward_iac.collections._barrier import Barrier
from skyward_iac.collections._counter import Counter
from skyward_iac.collections._dict import Dict
from skyward_iac.collections._lock import Lock
from skyward_iac.collections._queue import Queue
from skyward_iac.collections._set import Set
from skyward_iac.collections.cache import PrefixReplica
from skyward_iac.collections.client import EtcdClient
from skyward_iac.collections.namespace import Namespace
from skyward_iac.collections.pki import SERVER_NAME
from skyward_iac.collections.session import LeaseSession
from skyward_iac.collections.store import Consistency, Store, resolve_consistency

DEFAULT_LEASE_TTL = 10
DEFAULT_BARRIER_TIMEOUT = 300.0


@dataclass(frozen=True, slots=True)
class BackendConfig:
    """Everything needed to reach one job's collections; picklable, safe to repr.

    ``endpoints`` are ``host:port`` strings (a tunnel's local end works: the server is
    verified against ``server_name`` and the CA, not against the address). ``lease_ttl`` is how
    long a dead process keeps its locks. ``disabled_reason`` set means collections are off for
    this pool (``Options(cluster=False)``); every factory then raises with that reason.
    """

    endpoints: tuple[str, ...]
    job_id: str
    ca_pem: str = field(repr=False)
    cert_pem: str = field(repr=False)
    key_pem: str = field(repr=False)
    server_name: str = SERVER_NAME
    timeout: float = 10.0
    lease_ttl: int = DEFAULT_LEASE_TTL
    barrier_timeout: float = DEFAULT_BARRIER_TIMEOUT
    disabled_reason: str | None = None
    #: How long the first use waits for etcd to answer (a pool may run tasks before its head
    #: is up, with ``Nodes.min``); 0: do not wait.
    ready_timeout: float = 0.0

    def __post_init__(self) -> None:
        # A list would make the config unhashable; a bare string would iterate per character.
        endpoints = (self.endpoints,) if isinstance(self.endpoints, str) else self.endpoints
        object.__setattr__(self, "endpoints", tuple(endpoints))

    @classmethod
    def disabled(cls, reason: str, job_id: str = "disabled") -> BackendConfig:
        """A config for a pool without collections; ``reason`` is what users will read."""
        return cls(endpoints=(), job_id=job_id, ca_pem="", cert_pem="", key_pem="",
                   disabled_reason=reason)


class Backend:
    """One process's connection to one job's collections, and their factories.

    Proxies are cheap; the stores behind them (and the eventual replicas) are shared per
    collection, so repeated ``backend.dict("x")`` calls reuse one watch. Close it when done:
    that revokes the lease (releasing this process's locks at once) and ends the watches.
    """

    def __init__(self, config: BackendConfig) -> None:
        self.config = config
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._stores: builtins.dict[tuple[str, str, Consistency], Store] = {}
        self._replicas: builtins.dict[str, PrefixReplica] = {}
        self._session: LeaseSession | None = None
        self._client: EtcdClient | None = None
        self._closed = False
        self._ready = config.ready_timeout <= 0
        if config.disabled_reason is None:
            self.namespace = Namespace(config.job_id)
            self._client = EtcdClient(
                config.endpoints, ca_pem=config.ca_pem, cert_pem=config.cert_pem,
                key_pem=config.key_pem, server_name=config.server_name, timeout=config.timeout,
            )

    @property
    def enabled(self) -> bool:
        """False for a pool created with collections off."""
        return self.config.disabled_reason is None

    @property
    def client(self) -> EtcdClient:
        """The etcd client (RuntimeError when collections are disabled); the first use waits
        up to ``config.ready_timeout`` for etcd to answer."""
        if self._client is None and self._closed:
            raise CollectionError("this collections backend is closed; connect() a new one")
        if self._client is None:
            raise CollectionsDisabledError(
                f"distributed collections are disabled for this pool: {self.config.disabled_reason}"
            )
        if not self._ready:
            self._wait_ready(self._client)
        return self._client

    def _wait_ready(self, client: EtcdClient) -> None:
        """Wait (bounded) until etcd answers: the head may still be bootstrapping."""
        deadline = time.monotonic() + self.config.ready_timeout
        while True:
            try:
                client.server_version()
            except CollectionError as exc:
                if time.monotonic() >= deadline:
                    if self.config.ready_timeout:
                        raise CollectionError(
                            f"the pool's head (etcd at {', '.join(self.config.endpoints)}) was "
                            f"not ready within {self.config.ready_timeout:g}s: {exc}") from exc
                    self._ready = True  # no waiting asked: the operation reports it
                    return
                time.sleep(0.5)
                continue
            self._ready = True
            return

    # -- factories (the same names and signatures as sky.dict & co.) ---------------------------

    def dict(self, name: str, *, consistency: Consistency | None = None) -> Dict:
        """The shared dict ``name`` (created lazily; default consistency "eventual")."""
        return Dict(name, self._store(Dict.kind, name, resolve_consistency(consistency)))

    def set(self, name: str, *, consistency: Consistency | None = None) -> Set:
        """The shared set ``name`` (created lazily; default consistency "eventual")."""
        return Set(name, self._store(Set.kind, name, resolve_consistency(consistency)))

    def counter(self, name: str, *, consistency: Consistency | None = None) -> Counter:
        """The shared counter ``name`` (created lazily; default consistency "eventual")."""
        return Counter(name, self._store(Counter.kind, name, resolve_consistency(consistency)))

    def queue(self, name: str) -> Queue:
        """The shared FIFO queue ``name`` (always strong)."""
        return Queue(name, self._store(Queue.kind, name, "strong"))

    def barrier(self, name: str, n: int) -> Barrier:
        """The barrier ``name`` for ``n`` participants (always strong)."""
        store = self._store(Barrier.kind, name, "strong")
        return Barrier(name, store, n, self.config.barrier_timeout)

    def lock(self, name: str, timeout: float = 30) -> Lock:
        """The lock ``name``; ``acquire`` waits at most ``timeout`` seconds (always strong)."""
        return Lock(name, self._store(Lock.kind, name, "strong"), self._lease(), timeout)

    def ping(self) -> str:
        """One real round trip to etcd; returns its version."""
        return self.client.server_version()

    def close(self) -> None:
        """Revokes the lease, stops the watches and closes the channel (idempotent)."""
        with self._lock:
            session, self._session = self._session, None
            replicas, self._replicas = list(self._replicas.values()), {}
            self._stores.clear()
            client, self._client = self._client, None
        if session is not None:
            session.close()
        if client is not None:
            for replica in replicas:
                with contextlib.suppress(Exception):  # the channel is going away anyway
                    replica.close()
            client.close()
        self._closed = True

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "disabled" if not self.enabled else ", ".join(self.config.endpoints)
        return f"Backend(job_id={self.config.job_id!r}, {state})"

    def _store(self, kind: str, name: str, consistency: Consistency) -> Store:
        client = self.client  # raises with the reason when disabled
        prefix = self.namespace.collection(kind, name)
        with self._lock:
            store = self._stores.get((kind, name, consistency))
            if store is None:
                replica = None
                if consistency == "eventual":
                    replica = self._replicas.setdefault(prefix, PrefixReplica(client, prefix))
                store = self._stores[(kind, name, consistency)] = Store(client, prefix, replica)
            return store

    def _lease(self) -> LeaseSession:
        client = self.client
        with self._lock:
            if self._session is None:
                self._session = LeaseSession(client, self.config.lease_ttl)
            return self._session


def connect(config: BackendConfig) -> Backend:
    """A backend for ``config`` (no I/O yet: gRPC connects on the first call)."""
    return Backend(config)
