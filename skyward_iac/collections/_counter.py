"""The distributed counter: an atomic integer."""

from __future__ import annotations

import asyncio

from skyward_iac.collections.base import Collection, async_twin
from skyward_iac.collections.store import Store

_VALUE = "value"


class Counter(Collection):
    """A shared integer: ``value``, ``increment(n=1)``, ``decrement(n=1)``, ``reset(value=0)``,
    ``int(c)``.

    Increments are compare-and-swap transactions on etcd whatever the consistency, so none is
    ever lost; the consistency only decides whether ``value`` asks etcd or the local replica.
    """

    kind = "counter"

    def __init__(self, name: str, store: Store) -> None:
        super().__init__(name, store)
        self._key = store.key(_VALUE)

    @property
    def value(self) -> int:
        """The current value (from etcd when strong, from the replica when eventual)."""
        return self._store.read_int(self._key)

    def increment(self, n: int = 1) -> int:
        """Adds ``n`` atomically; returns the value this increment produced."""
        return self._store.add(self._key, int(n))

    def decrement(self, n: int = 1) -> int:
        """Subtracts ``n`` atomically; returns the value this decrement produced."""
        return self._store.add(self._key, -int(n))

    def reset(self, value: int = 0) -> None:
        """Sets the counter to ``value``."""
        self._store.set_int(self._key, int(value))

    def __int__(self) -> int:
        return self.value

    async def value_async(self) -> int:
        """Async twin of ``value`` (reads it in a worker thread)."""
        return await asyncio.to_thread(lambda: self.value)

    increment_async = async_twin(increment)
    decrement_async = async_twin(decrement)
    reset_async = async_twin(reset)
