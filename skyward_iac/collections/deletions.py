"""One watch of a lock's deletes, kept open across waits while the lock is contended.

A waiter that opens a watch and lists the claims after every claim pays two round trips (the
watch's creation, the listing) and a cancel per wait: with two processes contending for one
lock, 5 requests a pair instead of 2, most waits over before the listing came back, and 3.6 ms
of client CPU and 1.8 of etcd's a pair (2.0 and 1.0 with this watch). This watch is opened by
the first wait and kept while waits keep coming: a claim made while it is open (see
:meth:`Deletions.following`) needs no listing of its own, since every delete after the claim's
revision reaches the watch. The watch passes deletes only (etcd's ``NOPUT`` filter) and closes
once no wait has used it for ``IDLE`` seconds (by the next claim, or by a thread that looks
every ``IDLE`` seconds while it is open), so an uncontended lock is not sent its own changes
and a lock no longer used holds no watch.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyetcd.events import DeleteEvent

from skyward_iac.api.errors import CollectionError
from skyward_iac.collections.client import EtcdClient
from skyward_iac.collections.store import Store

#: Seconds without a wait after which the watch is closed (by the next uncontended claim).
IDLE = 2.0


class Vanished(Exception):
    """The waiter's own claim was deleted (its lease expired)."""


class Deletions:
    """The deletes under one prefix since the watch opened: key -> revision of its latest."""

    def __init__(self, client: EtcdClient, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._changed = threading.Condition()
        self._opening = threading.Lock()
        self._deleted: dict[str, int] = {}
        self._watch_id: int | None = None
        self._generation = 0
        self._following = 0
        self._last_wait = 0.0

    @contextmanager
    def following(self) -> Iterator[int | None]:
        """For a claim made inside the block: the generation of the watch open before it (every
        delete after the claim will reach it: pass it to :meth:`wait`), or None (the waiter
        must :meth:`open` and then list). On leaving, an open watch no wait used for ``IDLE``
        seconds is closed."""
        with self._changed:
            watching = self._generation if self._watch_id is not None else None
            self._following += 1
        try:
            yield watching
        finally:
            with self._changed:
                self._following -= 1
                if not self._following:
                    self._deleted.clear()  # nobody's claim predates what is recorded next
                stale = self._idle_watch()
            self._cancel(stale)

    def _idle_watch(self) -> int | None:
        """With ``_changed`` held: the open watch's id, now closed here, if no claim is being
        followed and no wait used it for ``IDLE`` seconds; else None."""
        if self._following or time.monotonic() - self._last_wait <= IDLE:
            return None
        stale, self._watch_id = self._watch_id, None
        if stale is not None:
            self._generation += 1
        return stale

    def _cancel(self, watch_id: int | None) -> None:
        if watch_id is not None:
            with contextlib.suppress(CollectionError):  # closed with its client already
                self._client.cancel_watch(watch_id)

    def _close_when_idle(self, generation: int) -> None:
        """While the watch of ``generation`` is open: close it once idle (a lock no longer
        used must not keep a watch, and its deletes, for the rest of the process)."""
        while True:
            time.sleep(IDLE)
            with self._changed:
                if self._generation != generation:
                    return  # closed, or broken and opened again (with its own thread)
                stale = self._idle_watch()
            if stale is not None:
                self._cancel(stale)
                return

    def open(self) -> int:
        """Opens the watch unless it is open (one round trip): deletes from now on are seen.
        Returns its generation for :meth:`wait`. Call it inside :meth:`following`, before the
        listing it is to complete."""
        with self._opening:
            with self._changed:
                if self._watch_id is not None:
                    return self._generation
                self._generation += 1
                generation = self._generation
            watch_id = self._client.watch(
                self._prefix, lambda item: self._on_change(generation, item), prefix=True,
                start_revision=0, deletes_only=True)
            with self._changed:
                if self._generation == generation:
                    self._watch_id = watch_id
                    self._last_wait = time.monotonic()  # its first wait comes next
                    threading.Thread(target=self._close_when_idle, args=(generation,),
                                     name="lock-deletes-idle", daemon=True).start()
                    return generation
            self._client.cancel_watch(watch_id)  # broke before we knew its id
            raise CollectionError(f"the watch on {self._prefix!r} broke as it opened; retry")

    def wait(self, generation: int, ahead: set[str], key: str, mine: int,
             deadline: float) -> bool:
        """Waits until every key of ``ahead`` is deleted after revision ``mine`` (the waiter's
        claim ``key``), as seen by the watch of ``generation``; False if that watch ended
        first (open it again and list), or the deadline passed; ``Vanished`` if ``key`` itself
        was deleted. Deletes are compared by revision, so a key deleted and claimed again
        before ``mine`` still counts as ahead."""
        with self._changed:
            try:
                while True:
                    if self._deleted.get(key, 0) > mine:
                        raise Vanished
                    if all(self._deleted.get(k, 0) > mine for k in ahead):
                        return True
                    remaining = deadline - time.monotonic()
                    if self._generation != generation or remaining <= 0:
                        return False
                    self._changed.wait(remaining)
            finally:
                self._last_wait = time.monotonic()

    def _on_change(self, generation: int, item: Any) -> None:
        """The watch's callback (pyetcd's watch thread): an event batch, or an error/None when
        the stream ended."""
        with self._changed:
            if isinstance(item, BaseException) or item is None or not hasattr(item, "events"):
                if self._generation == generation:
                    self._watch_id = None
                    self._generation += 1
            else:
                for event in item.events:
                    if isinstance(event, DeleteEvent):
                        # A delete's kv carries the delete's own revision as its mod revision.
                        self._deleted[event.key.decode()] = int(event.mod_revision)
            self._changed.notify_all()


_by_store: weakref.WeakKeyDictionary[Store, Deletions] = weakref.WeakKeyDictionary()
_by_store_lock = threading.Lock()


def deletions_of(store: Store) -> Deletions:
    """The deletes watch of ``store``'s lock, shared by every proxy of it in this process."""
    with _by_store_lock:
        found = _by_store.get(store)
        if found is None:
            found = _by_store[store] = Deletions(store.client, store.prefix)
        return found
