"""Which backend ``sky.dict("x")`` & co. talk to: the "current backend", resolved lazily.

Resolution order: the backend bound in the current context (``bind``: a ContextVar, so two
pools driven from one client process, or two tasks in one thread pool, never mix), then the
process default (``set_process_default``: what a worker agent installs once, so threads the
user starts inside a task see it too). Nothing bound -> ``NoActivePoolError`` (a RuntimeError).

Child processes: a backend is tied to the process that connected it (gRPC channels and lease
threads do not survive ``fork``). When ``current()`` finds a backend made by another process,
it connects a fresh one from the same ``BackendConfig`` for this process, once. With the
``spawn`` start method nothing is inherited: ship ``backend.config`` (picklable) to the child
and call ``set_process_default(connect(config))`` there.
"""

from __future__ import annotations

import builtins
import os
import threading
from collections.abc import Callable
from contextvars import ContextVar, Token

from skyward_iac.api.errors import NoActivePoolError
from skyward_iac.collections._barrier import Barrier
from skyward_iac.collections._counter import Counter
from skyward_iac.collections._dict import Dict
from skyward_iac.collections._lock import Lock
from skyward_iac.collections._queue import Queue
from skyward_iac.collections._set import Set
from skyward_iac.collections.backend import Backend, connect
from skyward_iac.collections.store import Consistency

#: A backend, or a function giving it on first use (a pool binds one before its head is up).
Bound = Backend | Callable[[], Backend]
_current: ContextVar[Bound | None] = ContextVar("skyward_collections_backend", default=None)
_process_default: Backend | None = None
_inherited_lock = threading.Lock()
_inherited: builtins.dict[int, Backend] = {}  # id(parent's backend) -> this process's twin

_NO_POOL = (
    "No active pool: distributed collections (sky.dict, sky.set, sky.counter, sky.queue, "
    "sky.barrier, sky.lock) resolve the pool running the current task. Call them inside a "
    "@sky.function running on a pool, or use pool.dict(...) & co. on the pool object."
)


def bind(backend: Bound | None) -> Token[Bound | None]:
    """Makes ``backend`` (or the backend a function returns when first needed) current in this
    context; pass the token to :func:`unbind` to undo."""
    return _current.set(backend)


def unbind(token: Token[Bound | None]) -> None:
    """Restores what was current before the matching :func:`bind`."""
    _current.reset(token)


def set_process_default(backend: Backend | None) -> None:
    """The backend used when no context binding exists (None removes it)."""
    global _process_default
    _process_default = backend


def current() -> Backend:
    """The backend collections resolve to right now; NoActivePoolError if there is none."""
    bound = _current.get() or _process_default
    if bound is None:
        raise NoActivePoolError(_NO_POOL)
    backend = bound if isinstance(bound, Backend) else bound()
    if backend.pid != os.getpid():
        backend = _for_this_process(backend)
    return backend


def dict(name: str, *, consistency: Consistency | None = None) -> Dict:
    """The shared dict ``name`` of the current pool (default consistency "eventual")."""
    return current().dict(name, consistency=consistency)


def set(name: str, *, consistency: Consistency | None = None) -> Set:
    """The shared set ``name`` of the current pool (default consistency "eventual")."""
    return current().set(name, consistency=consistency)


def counter(name: str, *, consistency: Consistency | None = None) -> Counter:
    """The shared counter ``name`` of the current pool (default consistency "eventual")."""
    return current().counter(name, consistency=consistency)


def queue(name: str) -> Queue:
    """The shared FIFO queue ``name`` of the current pool."""
    return current().queue(name)


def barrier(name: str, n: int) -> Barrier:
    """The barrier ``name`` of the current pool, for ``n`` participants."""
    return current().barrier(name, n)


def lock(name: str, timeout: float = 30) -> Lock:
    """The lock ``name`` of the current pool; ``acquire`` waits at most ``timeout`` seconds."""
    return current().lock(name, timeout)


def _for_this_process(parent: Backend) -> Backend:
    with _inherited_lock:
        mine = _inherited.get(id(parent))
        if mine is None or mine.pid != os.getpid():
            mine = _inherited[id(parent)] = connect(parent.config)
        return mine


def _after_fork_in_child() -> None:
    # The lock may have been held by a parent thread at fork time; the twins belong to the parent.
    global _inherited_lock
    _inherited_lock = threading.Lock()
    _inherited.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
