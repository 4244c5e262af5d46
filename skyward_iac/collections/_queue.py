"""The distributed FIFO queue, with exactly-once delivery to concurrent consumers."""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pyetcd.events import PutEvent

from skyward_iac.collections.base import Collection, async_twin, check_timeout
from skyward_iac.collections.client import (
    RangeOptions,
    all_created_since,
    create_revision_is,
    delete_op,
    put_op,
    range_op,
)
from skyward_iac.collections.namespace import decode_value, encode_value
from skyward_iac.collections.slots import ItemSlots
from skyward_iac.collections.store import Store

#: An item as ``(key, create revision)``.
Item = tuple[str, int]
#: How many of the oldest items one listing names (and how many own puts are remembered).
LISTED = 16
#: How a listing reads the queue: the ``LISTED`` oldest keys.
LISTING = RangeOptions(prefix=True, keys_only=True, oldest_first=True, limit=LISTED)


@dataclass
class _Listing:
    """What this process knows of one queue: the oldest items it listed and has not claimed
    yet (``items``, oldest first), the oldest items it put itself (``mine``, at most
    ``LISTED``), and the lock that makes its claims one at a time."""

    items: deque[Item] = field(default_factory=deque)
    mine: deque[Item] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The keys this process puts items under, reused (see ``slots``).
    slots: ItemSlots = field(default_factory=ItemSlots)


#: One listing per queue (per store) in this process.
_listings: weakref.WeakKeyDictionary[Store, _Listing] = weakref.WeakKeyDictionary()
_listings_lock = threading.Lock()


class Queue(Collection):
    """A shared FIFO: ``put(v)``, ``get(timeout=None)`` (None on timeout), ``empty()``,
    ``len(q)``. Always strongly consistent.

    Each item is its own key, ``<owner>-<slot>`` with slots reused once the process knows the
    item was taken (``slots.ItemSlots``; a put writes only if its key is absent), so the prefix
    etcd walks holds about the items queued, not every put since the last compaction. FIFO
    order is etcd's commit order (create revision). ``get``
    claims one item with a transaction that deletes it only if it is still the same key at the
    same create revision, so of many consumers racing for one item exactly one wins. A claim
    that fails lists the oldest items instead, in the same round trip, and the next claim names
    the first of them. Listing sorts the whole queue on the server (etcd cannot push a limit
    under a create-revision sort): fine for thousands of items.

    Which item a claim names, cheapest first:

    - The next one a listing named. A listing names the ``LISTED`` oldest items and the next
      ``get`` calls in this process claim them in order: one round trip per item while a
      backlog drains. The claim alone keeps FIFO: every item older than a listed one was listed
      before it, so once those are gone (claimed here, or a claim found them taken) a listed
      item that still exists is the oldest. That needs this process's claims to follow the
      listing's order, so they are made one at a time (every proxy of the queue in a process
      shares one listing).
    - With nothing listed, the oldest item this process put: that claim also requires that no
      item of the queue is older (one compare over the whole queue), so a ``put`` then a
      ``get`` are two round trips, not three.
    - Neither: the queue is listed first.
    """

    kind = "queue"

    def __init__(self, name: str, store: Store) -> None:
        super().__init__(name, store)
        with _listings_lock:
            self._listing = _listings.setdefault(store, _Listing())

    def put(self, value: Any) -> None:
        """Appends ``value`` to the queue."""
        data, slots = encode_value(value), self._listing.slots
        # Keys only have to be unique among queued items; order is the create revision.
        own = self._store.key(f"{slots.owner}-")
        while True:
            slot = slots.take()
            key = f"{own}{slot}"
            response = self._store.client.txn(
                [create_revision_is(key, 0)], [put_op(key, data)],
                [range_op(own, prefix=True, keys_only=True)])
            if response.succeeded:
                break
            # Still queued (taken by nobody yet): learn which of our slots are.
            slots.occupied({_slot(kv.key.decode()): int(kv.create_revision)
                            for kv in response.responses[0].response_range.kvs})
        created = int(response.header.revision)
        slots.placed(slot, created)
        with self._listing.lock:
            if len(self._listing.mine) < LISTED:
                self._listing.mine.append((key, created))

    def get(self, timeout: float | None = None) -> Any:
        """Removes and returns the oldest item, waiting up to ``timeout`` seconds for one
        (forever when None); returns None if none arrived in time."""
        if timeout is not None:
            timeout = check_timeout(timeout, f"queue {self.name!r} get(timeout)", zero=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._listing.lock:
            value, _ = self._next()
        if value is not None:
            return decode_value(value)
        if timeout == 0:
            return None
        # One watch for the whole wait: a claim that loses the race to another consumer waits
        # on, without a new watch. It starts from now (one from the empty read's revision is
        # served up to 100 ms late: see EtcdClient.changes), so one more try once it is open
        # covers what was put in between. Only a put can end the wait.
        with self._store.client.changes(self._store.prefix, prefix=True) as changes:
            with self._listing.lock:
                value, _ = self._next()
            if value is not None:
                return decode_value(value)
            while True:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                events = changes.next(remaining)
                if events is None:
                    return None
                if not any(isinstance(event, PutEvent) for event in events):
                    continue
                with self._listing.lock:
                    value, _ = self._next()
                if value is not None:
                    return decode_value(value)

    def _next(self) -> tuple[bytes | None, int]:
        """Claims the oldest item (see the class doc for which one a claim names): its value,
        or None and the revision at which the queue was found empty."""
        listing = self._listing
        while True:
            if listing.items:
                key, created = listing.items.popleft()
                compare = [create_revision_is(key, created)]
                with contextlib.suppress(ValueError):
                    listing.mine.remove((key, created))
            elif listing.mine:
                key, created = listing.mine.popleft()
                compare = [create_revision_is(key, created),
                           all_created_since(self._store.prefix, created)]
            else:
                found = self._store.client.range(self._store.prefix, **LISTING)
                if not self._relist(found):
                    return None, int(found.header.revision)
                continue
            claim = self._store.client.txn(compare, [delete_op(key, prev_kv=True)],
                                           [range_op(self._store.prefix, **LISTING)])
            if claim.succeeded:
                if key.startswith(self._store.key(f"{listing.slots.owner}-")):
                    listing.slots.claimed(_slot(key))
                return bytes(claim.responses[0].response_delete_range.prev_kvs[0].value), 0
            if not self._relist(claim.responses[0].response_range):
                return None, int(claim.header.revision)

    def _relist(self, found: Any) -> bool:
        """Makes ``found`` (a RangeResponse) the listing; False when it names nothing."""
        self._listing.items.clear()
        self._listing.items.extend((kv.key.decode(), int(kv.create_revision)) for kv in found.kvs)
        return bool(found.kvs)

    def empty(self) -> bool:
        """Whether the queue holds no item right now."""
        return self._store.count() == 0

    def __len__(self) -> int:
        return self._store.count()

    put_async = async_twin(put)
    get_async = async_twin(get)
    empty_async = async_twin(empty)
    len_async = async_twin(__len__)


def _slot(key: str) -> int:
    """The slot number at the end of an item key ``.../<owner>-<slot>``."""
    return int(key.rsplit("-", 1)[1])
