"""What every collection proxy shares: its name, its store, and the ``_async`` twins.

The twins run the synchronous method in the event loop's default thread executor
(``asyncio.to_thread``): etcd calls are blocking gRPC calls, and pyetcd cannot be imported next
to the asyncio client ``aetcd``. A twin holds one executor thread for as long as its call
blocks (a queue ``get`` or a barrier ``wait`` included), so size the executor accordingly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from skyward_iac.api.errors import ConfigError
from skyward_iac.collections.store import Store

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")


def async_twin(
    method: Callable[Concatenate[S, P], R],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """The ``_async`` version of a blocking method: same arguments, awaitable result."""

    async def twin(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await asyncio.to_thread(method, self, *args, **kwargs)

    twin.__module__ = method.__module__
    twin.__doc__ = f"Async twin of ``{method.__name__}`` (runs it in a worker thread)."
    return twin


class Collection:
    """A named proxy to one collection; cheap to create, all state lives in etcd."""

    kind = "collection"

    def __init__(self, name: str, store: Store) -> None:
        self.name = name
        self._store = store

    @property
    def consistency(self) -> str:
        """"strong" (reads go to etcd) or "eventual" (reads served by the local replica)."""
        return self._store.consistency

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, consistency={self.consistency!r})"


def check_timeout(value: object, what: str, zero: bool = False) -> float:
    """``value`` as a finite number of seconds > 0 (>= 0 with ``zero``: "do not wait"), else
    a ``ConfigError`` naming ``what``."""
    low_ok = (lambda v: v >= 0) if zero else (lambda v: v > 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            low_ok(value) and value < float("inf")):
        bound = ">= 0" if zero else "> 0"
        raise ConfigError(f"{what} must be a number of seconds {bound}, got {value!r}")
    return float(value)
