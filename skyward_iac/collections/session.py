"""A process's liveness in etcd: one lease, kept alive by a daemon thread.

Keys that must disappear with their owner (lock ownership) are attached to this lease. If the
process dies or is partitioned away, nobody refreshes the lease and etcd deletes those keys
after ``ttl`` seconds, which releases the locks. The thread is ours to run: pyetcd has none.
"""

from __future__ import annotations

import logging
import threading

from skyward_iac.api.errors import CollectionError
from skyward_iac.collections.client import EtcdClient

_log = logging.getLogger(__name__)


class LeaseSession:
    """A lease granted on first use and refreshed every ``ttl / 3`` seconds until closed.

    If the lease is lost anyway (a long partition), the next :meth:`lease_id` call grants a new
    one; keys attached to the old lease are gone by then, as they should be.
    """

    def __init__(self, client: EtcdClient, ttl: int) -> None:
        if ttl < 2:
            raise ValueError("etcd's smallest useful lease TTL is 2 seconds")
        self._client = client
        self.ttl = ttl
        self._lock = threading.Lock()
        self._lease_id: int | None = None
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def lease_id(self) -> int:
        """The live lease's id, granting one (and starting the keepalive thread) if needed."""
        with self._lock:
            if self._closed.is_set():
                raise CollectionError("this collections backend is closed; connect() a new one")
            if self._lease_id is None:
                self._lease_id = self._client.grant_lease(self.ttl)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._keep_alive, name="skyward-etcd-lease", daemon=True
                )
                self._thread.start()
            return self._lease_id

    def close(self) -> None:
        """Stops the keepalive and revokes the lease, releasing everything attached at once."""
        with self._lock:
            self._closed.set()
            lease_id, self._lease_id = self._lease_id, None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self._client.timeout)
        if lease_id is not None:
            try:
                self._client.revoke_lease(lease_id)
            except CollectionError as exc:  # it will expire on its own after ttl
                _log.debug("lease revoke failed: %s", exc)

    def _keep_alive(self) -> None:
        interval = self.ttl / 3
        while not self._closed.wait(interval):
            with self._lock:
                lease_id = self._lease_id
            if lease_id is None:
                continue
            try:
                alive = self._client.keep_alive(lease_id) > 0
            except CollectionError as exc:
                # Transient: retry at the next tick; etcd only drops the lease after a full ttl.
                _log.warning("etcd lease keepalive failed, retrying: %s", exc)
                continue
            if not alive:
                _log.warning("etcd lease %x expired; locks held through it were released",
                             lease_id)
                with self._lock:
                    if self._lease_id == lease_id:
                        self._lease_id = None
