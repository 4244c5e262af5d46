"""Numbered key slots a process hands out again once freed: keys that come back, not new ones.

etcd keeps a deleted key in its index until the history is compacted (the head's etcd keeps 10
minutes of it), and a range over a collection's prefix walks those entries too. A lock claim or
a queue item under a fresh key per operation made every listing pay for every operation of the
last 10 minutes; a process that reuses the slots it freed leaves about one index entry per
claim or item it has out at once.
"""

from __future__ import annotations

import heapq
import threading
import uuid
import weakref

from skyward_iac.collections.store import Store


class Slots:
    """Slot numbers of one collection in this process: the smallest free one first."""

    def __init__(self) -> None:
        self._free: list[int] = []
        self._next = 0
        self._lock = threading.Lock()

    def take(self) -> int:
        """A slot no caller of this process holds."""
        with self._lock:
            if self._free:
                return heapq.heappop(self._free)
            self._next += 1
            return self._next - 1

    def give_back(self, slot: int) -> None:
        """Frees ``slot`` (its key is gone from etcd) for the next :meth:`take`."""
        with self._lock:
            heapq.heappush(self._free, slot)


_by_store: weakref.WeakKeyDictionary[Store, Slots] = weakref.WeakKeyDictionary()
_by_store_lock = threading.Lock()


def slots_of(store: Store) -> Slots:
    """The slots of ``store``'s collection, shared by every proxy of it in this process."""
    with _by_store_lock:
        return _by_store.setdefault(store, Slots())


#: A put tries its oldest item's slot again once this process has this many items out (the
#: item was most likely taken by some consumer, which this process does not see).
GUESS_AT = 16


class ItemSlots:
    """Slots of the items this process put into one queue, keyed ``<owner>-<slot>``.

    A put takes a slot and writes only if its key is absent; this process's own ``get`` frees
    the slot of an item it claims. Items other consumers take are not seen, so once ``GUESS_AT``
    items are out a put tries the oldest one's slot again; a put that finds its slot still
    occupied is told which slots are (the same transaction lists this process's keys) and only
    guesses again when twice as many are out, so a backlog costs few extra round trips.
    """

    def __init__(self) -> None:
        self.owner = uuid.uuid4().hex[:16]
        self._free: list[int] = []
        self._out: dict[int, int] = {}  # slot -> create revision of the item put there
        self._next = 0
        self._guess_at = GUESS_AT
        self._lock = threading.Lock()

    def take(self) -> int:
        """A slot for the next item: a free one, the oldest item's when guessing, or a new one."""
        with self._lock:
            if self._free:
                return heapq.heappop(self._free)
            if len(self._out) >= self._guess_at:
                oldest = min(self._out, key=self._out.__getitem__)
                del self._out[oldest]
                return oldest
            self._next += 1
            return self._next - 1

    def placed(self, slot: int, created: int) -> None:
        """An item was written at ``slot`` (create revision ``created``)."""
        with self._lock:
            self._out[slot] = created

    def claimed(self, slot: int) -> None:
        """This process claimed the item at ``slot``: the slot is free."""
        with self._lock:
            self._out.pop(slot, None)
            heapq.heappush(self._free, slot)

    def occupied(self, slots: dict[int, int]) -> None:
        """A put found its slot taken; ``slots`` (slot -> create revision) are all of this
        process's items etcd still holds. The others' slots are free again."""
        with self._lock:
            for slot in [s for s in self._out if s not in slots]:
                del self._out[slot]
                heapq.heappush(self._free, slot)
            for slot, created in slots.items():
                if slot not in self._free:
                    self._out[slot] = created
            self._guess_at = 2 * len(slots) + GUESS_AT
