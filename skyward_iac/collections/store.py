"""The etcd plumbing every collection shares: one key range, read strongly or eventually.

A :class:`Store` owns one collection's prefix. Writes always go to etcd (as single puts,
deletes or transactions). Reads go to etcd when the store is "strong" (linearizable: etcd's
default range reads are served through the leader's quorum) and to a :class:`PrefixReplica`
when it is "eventual". Either way a write is recorded in the replica with the revision etcd
assigned to it, so a process always reads its own writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

from skyward_iac.api.errors import ConfigError
from skyward_iac.collections.cache import PrefixReplica
from skyward_iac.collections.client import (
    MAX_TXN_OPS,
    EtcdClient,
    delete_op,
    get_op,
    mod_revision_is,
    put_op,
    range_op,
)

Consistency: TypeAlias = Literal["strong", "eventual"]
CONSISTENCIES: tuple[Consistency, ...] = ("strong", "eventual")


def resolve_consistency(consistency: str | None, default: Consistency = "eventual") -> Consistency:
    """``None`` -> ``default``; anything but "strong"/"eventual" is a ConfigError."""
    if consistency is None:
        return default
    if consistency == "strong":
        return "strong"
    if consistency == "eventual":
        return "eventual"
    raise ConfigError(f"consistency must be 'strong' or 'eventual', not {consistency!r}")


class Store:
    """One collection's keys (``prefix`` + item), with the read path its consistency asks for."""

    def __init__(self, client: EtcdClient, prefix: str, replica: PrefixReplica | None) -> None:
        self.client = client
        self.prefix = prefix
        self.replica = replica
        # Last (mod revision, value) seen per key that ``add`` counts on (a barrier's arrivals):
        # the first compare-and-swap attempt usually succeeds without a read of its own.
        self._hints: dict[str, tuple[int, int]] = {}

    @property
    def consistency(self) -> Consistency:
        """How this store reads."""
        return "strong" if self.replica is None else "eventual"

    def key(self, item: str) -> str:
        """The full etcd key of one item of the collection."""
        return self.prefix + item

    # -- reads ---------------------------------------------------------------------------------

    def read(self, key: str) -> bytes | None:
        """The value at ``key`` or None: from etcd (strong) or the replica (eventual)."""
        if self.replica is not None:
            return self.replica.get(key)
        kvs = self.client.range(key).kvs
        return bytes(kvs[0].value) if kvs else None

    def exists(self, key: str) -> bool:
        """Whether ``key`` exists, without moving its value over the wire when strong."""
        if self.replica is not None:
            return self.replica.get(key) is not None
        return int(self.client.range(key, count_only=True).count) > 0

    def read_all(self) -> list[tuple[str, bytes]]:
        """Every (key, value) of the collection: one range read (strong) or the replica."""
        if self.replica is not None:
            return self.replica.items()
        kvs = self.client.range(self.prefix, prefix=True).kvs
        return [(kv.key.decode(), bytes(kv.value)) for kv in kvs]

    def count(self) -> int:
        """How many items the collection holds."""
        if self.replica is not None:
            return self.replica.count()
        return int(self.client.range(self.prefix, prefix=True, count_only=True).count)

    # -- writes --------------------------------------------------------------------------------

    def write(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Puts ``value`` at ``key``; returns the write's revision."""
        revision = int(self.client.put(key, value, lease=lease).header.revision)
        self.record(key, revision, value)
        return revision

    def write_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Puts many pairs, atomically per batch of etcd's transaction limit."""
        for start in range(0, len(items), MAX_TXN_OPS):
            batch = items[start:start + MAX_TXN_OPS]
            response = self.client.txn([], [put_op(k, v) for k, v in batch])
            for key, value in batch:
                self.record(key, int(response.header.revision), value)

    def write_and_list(self, key: str, value: bytes, *, lease: int = 0) -> tuple[int, Any]:
        """Puts ``value`` at ``key`` and lists the collection's keys, oldest first, in one
        transaction (one round trip; the listing includes the write). Returns the write's
        revision, which is also the listing's, and the listing (a RangeResponse)."""
        response = self.client.txn([], [
            put_op(key, value, lease),
            range_op(self.prefix, prefix=True, keys_only=True, oldest_first=True),
        ])
        revision = int(response.header.revision)
        self.record(key, revision, value)
        return revision, response.responses[1].response_range

    def replace_range(self, prefix: str, key: str, value: bytes) -> None:
        """Deletes every key under ``prefix`` and puts ``value`` at ``key`` (outside it), in one
        transaction."""
        response = self.client.txn([], [delete_op(prefix, prefix=True), put_op(key, value)])
        revision = int(response.header.revision)
        if self.replica is not None:
            self.replica.forget(prefix, revision)
        self.record(key, revision, value)

    def remove(self, key: str) -> bytes | None:
        """Deletes ``key``; returns the value it had (None if it did not exist)."""
        response = self.client.delete(key, prev_kv=True)
        self.record(key, int(response.header.revision), None)
        return bytes(response.prev_kvs[0].value) if response.prev_kvs else None

    def add(self, key: str, delta: int) -> int:
        """Atomically adds ``delta`` to the integer at ``key`` (absent = 0); returns the result.

        A compare-and-swap loop: put ``old + delta`` only if the key's mod revision is still the
        one ``old`` was read at; on a lost race the same transaction returns the current value.
        """
        revision, current = self._hint(key)
        while True:
            new = current + delta
            encoded = str(new).encode()
            response = self.client.txn([mod_revision_is(key, revision)],
                                       [put_op(key, encoded)], [get_op(key)])
            if response.succeeded:
                written = int(response.header.revision)
                self._hints[key] = (written, new)
                self.record(key, written, encoded)
                return new
            kvs = response.responses[0].response_range.kvs
            revision, current = (int(kvs[0].mod_revision), int(kvs[0].value)) if kvs else (0, 0)

    def _hint(self, key: str) -> tuple[int, int]:
        if self.replica is not None:
            data = self.replica.get(key)
            revision = self.replica.revision(key)
            if data is not None and revision:
                return revision, int(data)
        return self._hints.get(key, (0, 0))

    def record(self, key: str, revision: int, value: bytes | None) -> None:
        """Notes this process's own acknowledged write in the replica (read-your-writes)."""
        if self.replica is not None:
            self.replica.record(key, revision, value)
