"""The one seam to etcd: a mutual-TLS gRPC client built on ``pyetcd`` (etcd-sdk-python).

Every collection talks to etcd through :class:`EtcdClient` only. It returns etcd's own protobuf
responses (they carry the revisions the caches and the compare-and-swap loops need) and turns
every gRPC failure into :class:`CollectionError`, so users never catch ``grpc`` errors.

Two ``pyetcd`` traps are avoided on purpose: its ``Etcd3Client`` wants the private key in a file
(we pass PEM bytes straight to gRPC), and it marks an endpoint "failed" for 300 s after a single
UNAVAILABLE, which would make a one-endpoint client useless for five minutes after a blip.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Self, TypedDict, Unpack

import grpc
import pyetcd
from pyetcd import etcdrpc
from pyetcd.exceptions import Etcd3Exception, WatchTimedOut
from pyetcd.utils import prefix_range_end
from pyetcd.watch import WatchResponse

from skyward_iac.api.errors import CollectionError
from skyward_iac.collections.pki import SERVER_NAME
from skyward_iac.collections.unix_endpoint import UNIX_PREFIX, UnixEndpoint

# etcd's default --max-txn-ops; larger batches are split by the callers.
MAX_TXN_OPS = 128
_MAX_MESSAGE = 256 * 1024 * 1024

WatchCallback = Callable[[WatchResponse | Exception], None]


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) -> (host, port); ``ValueError`` when malformed (a
    ``unix:`` endpoint has no port: see ``UNIX_PREFIX``)."""
    host, sep, port = endpoint.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"etcd endpoint {endpoint!r} is not host:port")
    return host.strip("[]"), int(port)


class _Gate:
    """Lets calls onto the channel until it closes; ``close`` waits for those in flight. (gRPC
    does not raise for a stub made on a channel being closed: the process dies of SIGSEGV.)"""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._in_flight = 0
        self.closed = False

    @contextmanager
    def call(self, action: str, key: str) -> Iterator[None]:
        with self._changed:
            if self.closed:
                raise CollectionError(f"cannot {action} {key!r}: the connection to etcd is "
                                      "closed (its pool has closed)")
            self._in_flight += 1
        try:
            yield
        finally:
            with self._changed:
                self._in_flight -= 1
                self._changed.notify_all()

    def close(self, timeout: float) -> None:
        """Refuse new calls; wait (at most ``timeout``: each call has its deadline) for the rest."""
        with self._changed:
            self.closed = True
            self._changed.wait_for(lambda: self._in_flight == 0, timeout)


class EtcdClient:
    """A TLS client for one etcd cluster, authenticated by a client certificate.

    ``server_name`` is the name the server certificate is verified against (see ``pki``), which
    keeps verification strict even when the endpoint is a tunnel's loopback address.
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        ca_pem: str,
        cert_pem: str | None,
        key_pem: str | None,
        server_name: str = SERVER_NAME,
        timeout: float = 10.0,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        self.endpoints = tuple(endpoints)
        self.timeout = timeout
        credentials = grpc.ssl_channel_credentials(
            root_certificates=ca_pem.encode(),
            private_key=key_pem.encode() if key_pem else None,
            certificate_chain=cert_pem.encode() if cert_pem else None,
        )
        options = [
            ("grpc.ssl_target_name_override", server_name),
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            # Detect a dead head node on idle watch streams instead of waiting for TCP timeouts.
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
        ]
        # With one endpoint a "failed" mark only locks us out; with several it steers failover.
        retry = 0.0 if len(self.endpoints) == 1 else 1.0
        eps: list[pyetcd.Endpoint] = []
        for endpoint in self.endpoints:
            if endpoint.startswith(UNIX_PREFIX):
                eps.append(UnixEndpoint(endpoint, time_retry=retry, opts=options))
                continue
            host, port = parse_endpoint(endpoint)
            host = f"[{host}]" if ":" in host else host  # pyetcd joins host:port as given
            eps.append(pyetcd.Endpoint(host, port, secure=True, creds=credentials,
                                       time_retry=retry, opts=options))
        self._gate = _Gate()
        self._etcd = pyetcd.MultiEndpointEtcd3Client(
            endpoints=eps, timeout=timeout, failover=len(eps) > 1
        )

    # -- key/value -----------------------------------------------------------------------------

    def range(self, key: str, **options: Unpack[RangeOptions]) -> Any:
        """A RangeRequest (see ``RangeOptions``)."""
        with self._errors("read", key):
            return self._etcd.kvstub.Range(range_op(key, **options).request_range, self.timeout)

    def put(self, key: str, value: bytes, *, lease: int = 0) -> Any:
        """A PutRequest; the response header carries the write's revision."""
        with self._errors("write", key):
            return self._etcd.kvstub.Put(put_op(key, value, lease).request_put, self.timeout)

    def delete(self, key: str, *, prefix: bool = False, prev_kv: bool = False) -> Any:
        """A DeleteRangeRequest; with ``prev_kv`` the response holds the deleted pairs."""
        request = delete_op(key, prefix=prefix, prev_kv=prev_kv).request_delete_range
        with self._errors("delete", key):
            return self._etcd.kvstub.DeleteRange(request, self.timeout)

    def txn(
        self, compare: Sequence[Any], success: Sequence[Any], failure: Sequence[Any] = ()
    ) -> Any:
        """One atomic transaction (build its parts with the ``*_is`` and ``*_op`` helpers)."""
        request = etcdrpc.TxnRequest(compare=compare, success=success, failure=failure)
        key = compare[0].key.decode() if compare else "txn"
        with self._errors("transaction on", key):
            return self._etcd.kvstub.Txn(request, self.timeout)

    # -- watches -------------------------------------------------------------------------------

    def watch(self, key: str, callback: WatchCallback, *, prefix: bool, start_revision: int,
              deletes_only: bool = False) -> int:
        """Calls ``callback`` (on pyetcd's watch thread) for every change from ``start_revision``
        (only deletions with ``deletes_only``: etcd drops the puts before sending); an
        Exception is passed instead when the stream breaks. Returns the watch id."""
        kwargs: dict[str, Any] = {"start_revision": start_revision or None}
        if prefix:
            kwargs["range_end"] = prefix_range_end(key.encode())
        if deletes_only:
            kwargs["filters"] = [etcdrpc.WatchCreateRequest.NOPUT]
        with self._errors("watch", key):
            try:
                return int(self._etcd.watcher.add_callback(key.encode(), callback, **kwargs))
            except WatchTimedOut as exc:
                raise CollectionError(f"etcd did not accept a watch on {key!r} in time") from exc

    def cancel_watch(self, watch_id: int) -> None:
        """Stops a watch made by :meth:`watch` (no error if it already ended, or the client
        closed: that ended every watch)."""
        if self._gate.closed:
            return
        with self._errors("cancel a watch on", str(watch_id)):
            self._etcd.watcher.cancel(watch_id)

    @contextmanager
    def changes(self, key: str, *, prefix: bool, start_revision: int = 0) -> Iterator[Changes]:
        """A watch kept open for the block: every change of ``key`` (or under it) from
        ``start_revision`` on (0: from now), in etcd's order, read with :meth:`Changes.next`.
        One round trip opens it, however many changes a waiter then reads (cancelling sends,
        waits for nothing).

        Prefer 0 and a read once it is open: etcd serves a watch that starts in the past (any
        write anywhere since that revision) from a loop that runs every 100 ms, and its events
        came 64-82 ms late here, against 2-7 ms for one opened from now.
        """
        changes = Changes(key, self._translate)
        watch_id = self.watch(key, changes.put, prefix=prefix, start_revision=start_revision)
        try:
            yield changes
        finally:
            self.cancel_watch(watch_id)

    # -- leases --------------------------------------------------------------------------------

    def grant_lease(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; keys put with it vanish when it expires."""
        with self._errors("grant a lease for", "session"):
            request = etcdrpc.LeaseGrantRequest(TTL=ttl)
            reply = self._etcd.leasestub.LeaseGrant(request, self.timeout)
        return int(reply.ID)

    def keep_alive(self, lease_id: int) -> int:
        """Refreshes a lease once; returns its new TTL (0 means the lease is gone)."""
        request = etcdrpc.LeaseKeepAliveRequest(ID=lease_id)
        with self._errors("refresh lease", hex(lease_id)):
            for reply in self._etcd.leasestub.LeaseKeepAlive(iter([request]), self.timeout):
                return int(reply.TTL)
        return 0

    def revoke_lease(self, lease_id: int) -> None:
        """Ends a lease now, deleting every key attached to it."""
        with self._errors("revoke lease", hex(lease_id)):
            self._etcd.leasestub.LeaseRevoke(etcdrpc.LeaseRevokeRequest(ID=lease_id), self.timeout)

    # -- misc ----------------------------------------------------------------------------------

    def server_version(self) -> str:
        """The etcd version reported by the member we talk to (a real round trip)."""
        with self._errors("query the status of", "etcd"):
            reply = self._etcd.maintenancestub.Status(etcdrpc.StatusRequest(), self.timeout)
        return str(reply.version)

    def close(self) -> None:
        """Closes the gRPC channels and the watch stream, once the calls in flight are done;
        later calls raise ``CollectionError``."""
        self._gate.close(self.timeout + 1.0)
        self._etcd.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _errors(self, action: str, key: str) -> Iterator[None]:
        with self._gate.call(action, key):
            try:
                yield
            except (grpc.RpcError, Etcd3Exception) as exc:
                if len(self.endpoints) > 1 and isinstance(exc, grpc.RpcError) and exc.code() in (
                    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED
                ):
                    # Stubs are called directly, so pyetcd never sees the failure: steer failover.
                    self._etcd.endpoint_in_use.fail()
                    self._etcd._clear_old_stubs()
                raise self._translate(exc, action, key) from exc

    def _translate(self, exc: BaseException, action: str, key: str) -> CollectionError:
        where = ", ".join(self.endpoints)
        if isinstance(exc, grpc.RpcError):
            code, details = exc.code(), exc.details()
            if code == grpc.StatusCode.UNAVAILABLE:
                return CollectionError(
                    f"cannot {action} {key!r}: etcd at {where} is unreachable or refused our "
                    f"certificate ({details}); check that the pool is up and its head node's "
                    "etcd is running"
                )
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return CollectionError(
                    f"cannot {action} {key!r}: etcd at {where} did not answer within "
                    f"{self.timeout:g}s; the head node may be overloaded or partitioned"
                )
            return CollectionError(f"cannot {action} {key!r}: etcd said {code.name}: {details}")
        reason = str(exc) or type(exc).__name__
        return CollectionError(f"cannot {action} {key!r} on etcd at {where}: {reason}")


class Changes:
    """The changes one open watch delivered and nobody has read yet (see ``EtcdClient.changes``)."""

    def __init__(self, key: str,
                 translate: Callable[[BaseException, str, str], CollectionError]) -> None:
        self._key = key
        self._translate = translate
        self._queue: queue.Queue[WatchResponse | Exception] = queue.Queue()

    def put(self, item: WatchResponse | Exception) -> None:
        """The watch's callback (pyetcd's watch thread)."""
        self._queue.put(item)

    def next(self, timeout: float | None) -> list[Any] | None:
        """The next batch of events (pyetcd ``PutEvent``/``DeleteEvent``, oldest first), or None
        when ``timeout`` passes first; CollectionError when the watch broke."""
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, Exception):
            raise self._translate(item, "watch", self._key)
        return list(item.events)


# -- transaction parts -------------------------------------------------------------------------


def mod_revision_is(key: str, revision: int) -> Any:
    """Compare: the key was last written at ``revision`` (0 = the key does not exist)."""
    return etcdrpc.Compare(
        key=key.encode(), target=etcdrpc.Compare.MOD, result=etcdrpc.Compare.EQUAL,
        mod_revision=revision,
    )


def create_revision_is(key: str, revision: int) -> Any:
    """Compare: the key was created at ``revision`` (0 = the key does not exist)."""
    return etcdrpc.Compare(
        key=key.encode(), target=etcdrpc.Compare.CREATE, result=etcdrpc.Compare.EQUAL,
        create_revision=revision,
    )


def all_created_since(prefix: str, revision: int) -> Any:
    """Compare: every key under ``prefix`` was created at ``revision`` or later (none older).

    etcd applies a compare with a ``range_end`` to each key of the range."""
    return etcdrpc.Compare(
        key=prefix.encode(), range_end=prefix_range_end(prefix.encode()),
        target=etcdrpc.Compare.CREATE, result=etcdrpc.Compare.GREATER,
        create_revision=revision - 1,
    )


def put_op(key: str, value: bytes, lease: int = 0) -> Any:
    """Transaction op: put ``value`` at ``key`` (attached to ``lease`` when non-zero)."""
    return etcdrpc.RequestOp(
        request_put=etcdrpc.PutRequest(key=key.encode(), value=value, lease=lease)
    )


class RangeOptions(TypedDict, total=False):
    """What a range reads: one key, or every key under it as a ``prefix``; ``keys_only``,
    ``count_only``; ``oldest_first`` sorts by create revision (etcd then sorts the whole range
    before applying ``limit``)."""

    prefix: bool
    keys_only: bool
    count_only: bool
    oldest_first: bool
    limit: int


def range_op(key: str, **options: Unpack[RangeOptions]) -> Any:
    """Transaction op: a range read (see ``RangeOptions``)."""
    request = etcdrpc.RangeRequest(
        key=key.encode(), keys_only=options.get("keys_only", False),
        count_only=options.get("count_only", False), limit=options.get("limit", 0),
    )
    if options.get("prefix", False):
        request.range_end = prefix_range_end(key.encode())
    if options.get("oldest_first", False):
        request.sort_order = etcdrpc.RangeRequest.ASCEND
        request.sort_target = etcdrpc.RangeRequest.CREATE
    return etcdrpc.RequestOp(request_range=request)


def get_op(key: str) -> Any:
    """Transaction op: read ``key``."""
    return etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=key.encode()))


def delete_op(key: str, *, prefix: bool = False, prev_kv: bool = False) -> Any:
    """Transaction op: delete ``key`` (every key under it with ``prefix``), returning the
    deleted pairs when ``prev_kv``."""
    request = etcdrpc.DeleteRangeRequest(key=key.encode(), prev_kv=prev_kv)
    if prefix:
        request.range_end = prefix_range_end(key.encode())
    return etcdrpc.RequestOp(request_delete_range=request)
