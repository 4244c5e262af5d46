"""Distributed collections on etcd: dict, set, counter, queue, barrier and lock.

``dict``/``set``/``counter``/``queue``/``barrier``/``lock`` resolve the current backend (see
``context``); a :class:`Backend` also offers them as methods (what ``pool.dict`` delegates to).
The head node's etcd is started by ``python -m skyward_iac.node etcd-server`` and secured by
the certificates of ``skyward_iac.collections.pki``.
"""

from __future__ import annotations

from skyward_iac.api.errors import CollectionError, CollectionsDisabledError
from skyward_iac.collections._barrier import Barrier
from skyward_iac.collections._counter import Counter
from skyward_iac.collections._dict import Dict
from skyward_iac.collections._lock import Lock
from skyward_iac.collections._queue import Queue
from skyward_iac.collections._set import Set
from skyward_iac.collections.backend import Backend, BackendConfig, connect
from skyward_iac.collections.context import (
    barrier,
    bind,
    counter,
    current,
    dict,
    lock,
    queue,
    set,
    set_process_default,
    unbind,
)
from skyward_iac.collections.store import Consistency

__all__ = [
    "Backend",
    "BackendConfig",
    "Barrier",
    "CollectionError",
    "CollectionsDisabledError",
    "Consistency",
    "Counter",
    "Dict",
    "Lock",
    "Queue",
    "Set",
    "barrier",
    "bind",
    "connect",
    "counter",
    "current",
    "dict",
    "lock",
    "queue",
    "set",
    "set_process_default",
    "unbind",
]
