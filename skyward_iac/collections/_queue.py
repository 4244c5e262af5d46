"""The distributed FIFO queue, with exactly-once delivery to concurrent consumers."""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from skyward_iac.collections.base import Collection, async_twin, check_timeout
from skyward_iac.collections.client import create_revision_is, delete_op
from skyward_iac.collections.namespace import decode_value, encode_value
from skyward_iac.collections.store import Store


@dataclass
class _Listing:
    """The oldest items of one queue this process has listed and not claimed yet (oldest first,
    as ``(key, create revision)``), and the lock that makes its claims one at a time."""

    items: deque[tuple[str, int]] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)


#: One listing per queue (per store) in this process.
_listings: weakref.WeakKeyDictionary[Store, _Listing] = weakref.WeakKeyDictionary()
_listings_lock = threading.Lock()


class Queue(Collection):
    """A shared FIFO: ``put(v)``, ``get(timeout=None)`` (None on timeout), ``empty()``,
    ``len(q)``. Always strongly consistent.

    Each item is its own key; FIFO order is etcd's commit order (create revision). ``get``
    claims the oldest item with a transaction that deletes it only if it is still the same key
    at the same create revision, so of many consumers racing for one item exactly one wins and
    the others move on to the next. Finding the oldest item sorts the whole queue on the server
    (etcd cannot push a limit under a create-revision sort): fine for thousands of items.

    A listing names the ``LISTED`` oldest items, and the next ``get`` calls in this process
    claim them in order without listing again: one round trip per item while a backlog drains.
    The claim alone keeps FIFO: every item older than a listed one was listed before it, so once
    those are gone (claimed here, or a claim found them taken) a listed item that still exists
    is the oldest. That needs this process's claims to follow the listing's order, so they are
    made one at a time (every proxy of the queue in a process shares one listing); a failed
    claim drops the rest of the listing.
    """

    kind = "queue"
    #: How many of the oldest items one listing names.
    LISTED = 16

    def __init__(self, name: str, store: Store) -> None:
        super().__init__(name, store)
        with _listings_lock:
            self._listing = _listings.setdefault(store, _Listing())

    def put(self, value: Any) -> None:
        """Appends ``value`` to the queue."""
        # The key only has to be unique; ordering comes from the create revision.
        self._store.write(self._store.key(f"{time.time_ns():020d}-{uuid.uuid4().hex}"),
                          encode_value(value))

    def get(self, timeout: float | None = None) -> Any:
        """Removes and returns the oldest item, waiting up to ``timeout`` seconds for one
        (forever when None); returns None if none arrived in time."""
        if timeout is not None:
            timeout = check_timeout(timeout, f"queue {self.name!r} get(timeout)", zero=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._listing.lock:
                value, empty_at = self._next()
            if value is not None:
                return decode_value(value)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            # Wait for any change after the read that found the queue empty (none is missed).
            self._store.client.wait_for_change(self._store.prefix, prefix=True,
                                               start_revision=empty_at + 1, timeout=remaining)

    def _next(self) -> tuple[bytes | None, int]:
        """Claims the oldest item (listing again when nothing listed is left): its value, or
        None and the revision at which the queue was found empty."""
        listed = self._listing.items
        while True:
            while listed:
                if (value := self._claim(*listed.popleft())) is not None:
                    return value, 0
                listed.clear()  # taken by another consumer: the rest may be too
            found = self._store.client.range(self._store.prefix, prefix=True, keys_only=True,
                                             oldest_first=True, limit=self.LISTED)
            if not found.kvs:
                return None, int(found.header.revision)
            listed.extend((kv.key.decode(), int(kv.create_revision)) for kv in found.kvs)

    def _claim(self, key: str, created: int) -> bytes | None:
        """Deletes ``key`` if it is still the item created at ``created``; its value, or None
        if another consumer took it first."""
        claim = self._store.client.txn([create_revision_is(key, created)],
                                       [delete_op(key, prev_kv=True)])
        prev = claim.responses[0].response_delete_range.prev_kvs if claim.succeeded else ()
        return bytes(prev[0].value) if prev else None

    def empty(self) -> bool:
        """Whether the queue holds no item right now."""
        return self._store.count() == 0

    def __len__(self) -> int:
        return self._store.count()

    put_async = async_twin(put)
    get_async = async_twin(get)
    empty_async = async_twin(empty)
    len_async = async_twin(__len__)
