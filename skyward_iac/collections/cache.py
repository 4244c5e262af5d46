"""The local replica behind "eventual" collections: a prefix of etcd kept fresh by a watch.

A read is a dict lookup under a lock (microseconds). The replica starts with one range read at
revision R and a watch from R+1, so no change between the two is missed. Every entry remembers
the revision that produced it and only a newer revision may replace it, which makes two sources
of truth safe to mix: watch events, and this process's own writes recorded as soon as etcd
acknowledges them (read-your-writes without waiting for the watch to catch up).

When the watch stream breaks (etcd restarted, network lost, history compacted) the replica
marks itself stale and the next read re-syncs; deletions missed meanwhile are applied then.
"""

from __future__ import annotations

import logging
import threading

from pyetcd.events import DeleteEvent
from pyetcd.watch import WatchResponse

from skyward_iac.collections.client import EtcdClient

_log = logging.getLogger(__name__)

_MISSING = None  # an entry whose latest known state is "deleted"


class PrefixReplica:
    """A read-only mirror of every key under ``prefix``; start it lazily with :meth:`ensure`."""

    def __init__(self, client: EtcdClient, prefix: str) -> None:
        self._client = client
        self.prefix = prefix
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()  # one re-sync at a time; readers never wait on I/O twice
        # key -> (revision that produced this state, value or _MISSING)
        self._entries: dict[str, tuple[int, bytes | None]] = {}
        self._synced = False
        self._watch_id: int | None = None

    def ensure(self) -> None:
        """Syncs from etcd if the replica never synced or its watch broke."""
        if self._synced:
            return
        with self._sync_lock:
            if self._synced:
                return
            if self._watch_id is not None:  # a stream that broke, or an old one: never keep two
                self._client.cancel_watch(self._watch_id)
                self._watch_id = None
            response = self._client.range(self.prefix, prefix=True)
            revision = int(response.header.revision)
            present = {
                kv.key.decode(): (int(kv.mod_revision), bytes(kv.value)) for kv in response.kvs
            }
            with self._lock:
                for key, (rev, data) in present.items():
                    self._apply_locked(key, rev, data)
                # Keys we hold but etcd no longer has were deleted while we were not watching.
                for key, (rev, held) in list(self._entries.items()):
                    if key not in present and held is not _MISSING and rev <= revision:
                        self._entries[key] = (revision, _MISSING)
            stream = _Stream()
            self._watch_id = self._client.watch(
                self.prefix, lambda item: self._on_watch(stream, item), prefix=True,
                start_revision=revision + 1,
            )
            with self._lock:  # the stream may already have broken: then stay unsynced
                self._synced = not stream.broken

    def get(self, key: str) -> bytes | None:
        """The replicated value of ``key`` (None when absent)."""
        self.ensure()
        with self._lock:
            entry = self._entries.get(key)
        return None if entry is None else entry[1]

    def count(self) -> int:
        """How many keys under the prefix exist, as far as the replica knows."""
        self.ensure()
        with self._lock:
            return sum(1 for _, value in self._entries.values() if value is not _MISSING)

    def items(self) -> list[tuple[str, bytes]]:
        """Every (key, value) under the prefix, as far as the replica knows."""
        self.ensure()
        with self._lock:
            return [(key, value) for key, (_, value) in self._entries.items()
                    if value is not _MISSING]

    def revision(self, key: str) -> int:
        """The mod revision of the replica's state of ``key`` (0 when unknown or deleted)."""
        with self._lock:
            entry = self._entries.get(key)
        return 0 if entry is None or entry[1] is _MISSING else entry[0]

    def record(self, key: str, revision: int, value: bytes | None) -> None:
        """Records this process's own acknowledged write (``None`` = deleted at ``revision``)."""
        with self._lock:
            self._apply_locked(key, revision, value)

    def forget(self, prefix: str, revision: int) -> None:
        """Records this process's own deletion of every key under ``prefix`` at ``revision``."""
        with self._lock:
            for key, (rev, value) in list(self._entries.items()):
                if key.startswith(prefix) and value is not _MISSING and rev < revision:
                    self._entries[key] = (revision, _MISSING)

    def close(self) -> None:
        """Stops the watch; the replica re-syncs if it is read again."""
        with self._sync_lock:
            watch_id, self._watch_id = self._watch_id, None
            with self._lock:
                self._synced = False
        if watch_id is not None:
            self._client.cancel_watch(watch_id)

    def _on_watch(self, stream: _Stream, item: WatchResponse | Exception) -> None:
        if isinstance(item, Exception):
            _log.info("watch on %s ended (%s); re-syncing on next read", self.prefix, item)
            with self._lock:
                stream.broken = True
                self._synced = False
            return
        with self._lock:
            for event in item.events:
                value = _MISSING if isinstance(event, DeleteEvent) else bytes(event.value)
                self._apply_locked(event.key.decode(), int(event.mod_revision), value)

    def _apply_locked(self, key: str, revision: int, value: bytes | None) -> None:
        current = self._entries.get(key)
        if current is None or revision > current[0]:
            self._entries[key] = (revision, value)


class _Stream:
    """Whether one watch stream broke; each sync gets its own, so a late error from an old
    stream cannot mark a newer one broken."""

    __slots__ = ("broken",)

    def __init__(self) -> None:
        self.broken = False
