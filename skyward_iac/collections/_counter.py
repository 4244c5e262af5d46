"""The distributed counter: an atomic integer whose increments never contend."""

from __future__ import annotations

import asyncio
import threading
import uuid
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from skyward_iac.collections.base import Collection, async_twin
from skyward_iac.collections.client import MAX_TXN_OPS, delete_op, mod_revision_is, put_op, range_op
from skyward_iac.collections.store import Store

#: The base every shard adds to: what ``reset`` writes (and all a counter was before shards).
_BASE = "value"
#: One key per writer slot under it, holding the sum of that slot's increments.
_SHARDS = "shards/"
#: More shards than this in a listing and the incrementing process folds the stale ones into
#: the base (processes that ended leave theirs behind, and every increment lists them all).
FOLD_AT = 64
#: A shard is stale when etcd took this many writes since its last change: folding it then
#: seldom races its owner (whose next increment would simply start a new value at 0).
STALE_AFTER = 1000

@dataclass
class _Shard:
    """One writer slot: its key, the mod revision of our last write to it (0: not written,
    or gone), and the value we wrote."""

    key: str
    revision: int = 0
    value: int = 0


class _Shards:
    """This process's shards of one counter: one per thread incrementing at the same time."""

    def __init__(self, store: Store) -> None:
        self.prefix = store.key(_SHARDS)
        self._free: list[_Shard] = []
        self._lock = threading.Lock()

    def take(self) -> _Shard:
        with self._lock:
            return self._free.pop() if self._free else _Shard(self.prefix + uuid.uuid4().hex)

    def give_back(self, shard: _Shard) -> None:
        with self._lock:
            self._free.append(shard)


_pools: weakref.WeakKeyDictionary[Store, _Shards] = weakref.WeakKeyDictionary()
_pools_lock = threading.Lock()


def total(values: Iterable[bytes]) -> int:
    """The counter's value: the base plus every shard (each an integer in ASCII)."""
    return sum(int(value) for value in values)


def fold_plan(kvs: Iterable[Any], base: str, keep: str, revision: int) -> list[Any]:
    """The shards to fold into the base, oldest first: once there are more than ``FOLD_AT``
    besides ``keep``, those unchanged for ``STALE_AFTER`` revisions before ``revision`` (at
    most what one transaction may name); else none."""
    shards = [kv for kv in kvs if kv.key.decode() not in (base, keep)]
    if len(shards) <= FOLD_AT:
        return []
    stale = [kv for kv in shards if int(kv.mod_revision) <= revision - STALE_AFTER]
    return sorted(stale, key=lambda kv: int(kv.mod_revision))[:MAX_TXN_OPS - 1]

class Counter(Collection):
    """A shared integer: ``value``, ``increment(n=1)``, ``decrement(n=1)``, ``reset(value=0)``,
    ``int(c)``.

    The value is a base plus one shard per writer: an increment is one etcd transaction that
    adds to the caller's own shard (guarded by the shard's mod revision) and reads every shard
    at the same revision, so it returns the value it produced, and two writers never retry each
    other's compare-and-swap (one thread per shard at a time; a process keeps its shards for the
    next increments). Whatever the consistency, increments go to etcd and none is ever lost; the
    consistency only decides whether ``value`` asks etcd or the local replica.
    """

    kind = "counter"

    def __init__(self, name: str, store: Store) -> None:
        super().__init__(name, store)
        self._base = store.key(_BASE)
        with _pools_lock:
            self._shards = _pools.setdefault(store, _Shards(store))

    @property
    def value(self) -> int:
        """The current value (from etcd when strong, from the replica when eventual)."""
        return total(value for _, value in self._store.read_all())

    def increment(self, n: int = 1) -> int:
        """Adds ``n`` atomically; returns the value this increment produced."""
        return self._add(int(n))

    def decrement(self, n: int = 1) -> int:
        """Subtracts ``n`` atomically; returns the value this decrement produced."""
        return self._add(-int(n))

    def reset(self, value: int = 0) -> None:
        """Sets the counter to ``value`` (every shard goes; writers start theirs again)."""
        self._store.replace_range(self._shards.prefix, self._base, str(int(value)).encode())

    def __int__(self) -> int:
        return self.value

    def _add(self, delta: int) -> int:
        store, client = self._store, self._store.client
        listing = range_op(store.prefix, prefix=True)
        shard = self._shards.take()
        try:
            while True:
                new = str(shard.value + delta).encode()
                response = client.txn([mod_revision_is(shard.key, shard.revision)],
                                      [put_op(shard.key, new), listing], [listing])
                if response.succeeded:
                    shard.revision, shard.value = int(response.header.revision), int(new)
                    store.record(shard.key, shard.revision, new)
                    kvs = response.responses[1].response_range.kvs
                    self._fold(kvs, shard.key, shard.revision)
                    return total(kv.value for kv in kvs)
                # Our shard changed under us (a reset or a fold took it): start from etcd's view.
                kvs = response.responses[0].response_range.kvs
                mine = [kv for kv in kvs if kv.key.decode() == shard.key]
                shard.revision, shard.value = (
                    (int(mine[0].mod_revision), int(mine[0].value)) if mine else (0, 0))
        finally:
            self._shards.give_back(shard)

    def _fold(self, kvs: Iterable[Any], keep: str, revision: int) -> bool:
        """Folds stale shards into the base once there are too many; True if it did (best
        effort: a concurrent increment or reset makes the fold's compare fail, and the next
        listing tries again)."""
        kvs = list(kvs)
        folded = fold_plan(kvs, self._base, keep, revision)
        if not folded:
            return False
        base = [kv for kv in kvs if kv.key.decode() == self._base]
        base_revision, base_value = ((int(base[0].mod_revision), int(base[0].value))
                                     if base else (0, 0))
        compare = [mod_revision_is(self._base, base_revision)]
        compare += [mod_revision_is(kv.key.decode(), int(kv.mod_revision)) for kv in folded]
        new_base = str(base_value + total(kv.value for kv in folded)).encode()
        response = self._store.client.txn(
            compare, [put_op(self._base, new_base), *(delete_op(kv.key.decode()) for kv in folded)])
        return bool(response.succeeded)

    async def value_async(self) -> int:
        """Async twin of ``value`` (reads it in a worker thread)."""
        return await asyncio.to_thread(lambda: self.value)

    increment_async = async_twin(increment)
    decrement_async = async_twin(decrement)
    reset_async = async_twin(reset)
