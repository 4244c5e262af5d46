"""The distributed lock: mutual exclusion across the cluster, released if its holder dies."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from types import TracebackType

from skyward_iac.api.errors import CollectionError
from skyward_iac.collections.base import Collection, async_twin, check_timeout
from skyward_iac.collections.deletions import Deletions, Vanished, deletions_of
from skyward_iac.collections.session import LeaseSession
from skyward_iac.collections.slots import slots_of
from skyward_iac.collections.store import Store

#: The claims this process holds, by (lock prefix, thread): a lock acquired through one proxy
#: can be released through another in the same task (``sky.lock("x")`` twice).
_claims: dict[tuple[str, int], str] = {}
_claims_lock = threading.Lock()


class Lock(Collection):
    """A mutex: ``acquire()``, ``release()``, ``with lock:`` (and ``async with``).

    etcd's own recipe: every contender puts a key under the lock's prefix, attached to its
    process's lease; the key with the oldest create revision holds the lock (first come first
    served). A waiter crosses off the claims ahead of it as their deletes arrive on one
    watch of the lock's deletes, with no listing per wake-up (etcd's recipe watches only the
    key just ahead and lists again after each delete; here every waiter is sent the lock's
    deletes instead, which costs no round trip). The watch stays open while the lock is
    contended (see ``deletions``): a claim made while it is open waits with no round trip
    beyond the claim's own (which lists the contenders). A holder that
    dies stops refreshing its lease, etcd deletes its key after the lease TTL, and
    the next waiter proceeds. Not reentrant.

    A claim's key is ``<lease>-<slot>``, the slot reused once its claim is deleted (see
    ``slots``): the lock's prefix holds one key per claim this process makes at once, not one
    per acquire since the last compaction.
    """

    kind = "lock"

    def __init__(self, name: str, store: Store, session: LeaseSession, timeout: float) -> None:
        super().__init__(name, store)
        self.timeout = check_timeout(timeout, f"sky.lock({name!r}) timeout")
        self._session = session
        self._mutex = threading.Lock()
        self._held: str | None = None

    def acquire(self, timeout: float | None = None) -> bool:
        """Waits until this caller holds the lock; returns True.

        Raises TimeoutError after ``timeout`` seconds (default: the ``timeout`` the lock was
        created with).
        """
        limit = self.timeout if timeout is None else check_timeout(timeout, "acquire(timeout)")
        deadline = time.monotonic() + limit
        lease, slot = self._session.lease_id(), slots_of(self._store).take()
        key = self._store.key(f"{lease:x}-{slot}")
        owner = f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}".encode()
        # The claim and the look at the contenders are one round trip. (If it fails the claim
        # may still have landed: the slot is never handed out again.)
        deletions = deletions_of(self._store)
        with deletions.following() as generation:
            mine, contenders = self._store.write_and_list(key, owner, lease=lease)
            try:
                if not any(kv.key.decode() == key for kv in contenders.kvs):
                    raise self._vanished()
                # By create revision, not by name: a key ahead may be deleted and claimed
                # again (keys are reused), and the new claim is younger than ours.
                ahead = {kv.key.decode() for kv in contenders.kvs if kv.create_revision < mine}
                if ahead:
                    self._wait_out(deletions, generation, ahead, key, mine, deadline, limit)
                with self._mutex:
                    self._held = key
                with _claims_lock:
                    _claims[(self._store.prefix, threading.get_ident())] = key
                return True
            except BaseException:
                # Withdraw, or the next waiter waits for us until our lease ends with the process.
                with contextlib.suppress(CollectionError):
                    self._delete(key)
                raise

    def _wait_out(self, deletions: Deletions, generation: int | None, ahead: set[str], key: str,
                  mine: int, deadline: float, limit: float) -> None:
        """Waits until every claim of ``ahead`` (older than ours, made at revision ``mine``) is
        deleted: a released, withdrawn or expired claim is a delete event. With the lock's
        deletes watch open before our claim (``generation``) the claim's own listing is
        enough; otherwise (or when that watch ends) the watch is opened from now and one
        listing names the claims still ahead (a watch from the claim's revision is served up
        to 100 ms late: see ``EtcdClient.changes``). Claims made later are younger than ours:
        the set ahead can only shrink. Raises if our own claim is deleted."""
        try:
            while generation is None or not deletions.wait(generation, ahead, key, mine,
                                                           deadline):
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"lock {self.name!r} is still held by another task after {limit:g}s; "
                        "pass a larger timeout to sky.lock(...) or acquire(timeout=...)"
                    )
                generation = deletions.open()
                listed = self._store.client.range(self._store.prefix, prefix=True,
                                                  keys_only=True).kvs
                if not any(kv.key.decode() == key for kv in listed):
                    raise self._vanished()
                ahead = {kv.key.decode() for kv in listed if kv.create_revision < mine}
        except Vanished:
            raise self._vanished() from None

    def _vanished(self) -> CollectionError:
        return CollectionError(
            f"lock {self.name!r}: our claim vanished while waiting (this process's etcd lease "
            "expired, e.g. after a long pause or partition); retry"
        )

    def release(self) -> None:
        """Releases the lock held through this proxy, or through another proxy of the same lock
        in this thread; RuntimeError if neither holds it."""
        # Take the key before deleting it: the next holder may set _held right after.
        with self._mutex:
            key, self._held = self._held, None
        with _claims_lock:
            if key is None:
                key = _claims.pop((self._store.prefix, threading.get_ident()), None)
            else:
                for claim in [c for c, held in _claims.items() if held == key]:
                    del _claims[claim]
        if key is None:
            raise RuntimeError(f"lock {self.name!r} released but not held by this task")
        self._delete(key)

    def _delete(self, key: str) -> None:
        """Deletes a claim and frees its slot (kept out of use if the delete failed)."""
        self._store.client.delete(key)
        slots_of(self._store).give_back(int(key.rsplit("-", 1)[1]))

    def __enter__(self) -> Lock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    acquire_async = async_twin(acquire)
    release_async = async_twin(release)

    async def __aenter__(self) -> Lock:
        await self.acquire_async()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release_async()

    def __repr__(self) -> str:
        return f"Lock({self.name!r}, timeout={self.timeout:g})"
