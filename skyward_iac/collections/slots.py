"""Numbered key slots a process hands out again once freed: keys that come back, not new ones.

etcd keeps a deleted key in its index until the history is compacted (the head's etcd keeps 10
minutes of it), and a range over a collection's prefix walks those entries too. A lock claim
under a fresh key per acquire made every listing of the lock pay for every acquire of the
last 10 minutes; a process that reuses the slots it freed leaves one index entry per claim it
holds at once.
"""

from __future__ import annotations

import heapq
import threading
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
