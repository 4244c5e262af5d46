"""A large argument passed to many tasks crosses the wire once per node connection.

Two steps, both on the client:

- Packing (``prepare``, from ``calls.pack_call``): an out-of-band buffer of at least
  ``SHARE_MIN`` bytes whose object was seen in a call before (by identity, weakly: a numpy
  array passed again) is digested (xxh3-128) and wrapped as a ``Shareable``. One seen for the
  first time is sent as before, undigested: a lone call pays nothing for sharing (the digest
  would cost it 10-20% of a 100 MB call at the wire's best), and a second call on the same
  array sends it again once, with ``Keep``. Calls that need no snapshot because their caller
  waits for them all (``copy=False``: ``sky.gather(...) >> pool``) share a ``BatchDigests``:
  each whole object is digested once for all of them, from the first call on, since it cannot
  change before they are done. A call that must snapshot its arguments (``copy=True``: the
  caller may change its array as soon as the call is made) copies a buffer only if no live
  snapshot has the same digest; equal bytes share one, so 64 calls on one 100 MB array hold
  one copy, not 64.
- Sending (``send``; a ``SharedBuffers`` per agent connection): the first task to carry a
  digest sends its bytes with ``Keep`` (node/shared_refs.py); later ones send ``Use(digest)``.
  The client alone decides what the agent keeps: a byte budget per connection
  (``SKYWARD_SHARED_BUDGET``, 1 GiB by default, never more than the agent's cap from
  ``Welcome``), least recently used forgotten first, each ``Keep`` naming what the agent must
  forget before keeping it. Tasks get their references and are sent under one lock, so the
  agent sees them in the order the references assume, and no round trip is needed.

Why xxh3-128 and not a cryptographic hash: it digests 100 MB in about 20 ms here, sha256 in
about 170 ms, which alone would eat most of the gain over 64 tasks. A digest only names bytes
this client itself sent on this one connection, to an agent that keeps them for this connection
alone: nobody else can feed the cache, so there is no adversary to collide against, and an
accidental 128-bit collision is out of reach.

``SKYWARD_SHARED_ARGS=0`` turns sharing off (read at each call, so one process can compare):
buffers are then copied and sent per task, as before.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.switches import switched_on
from skyward_iac.node.messages import Task
from skyward_iac.node.shared_refs import Keep, Use

#: Buffers at least this large are shared; smaller ones cost less to send than to digest.
SHARE_MIN = 1 << 20
#: Bytes a connection's agent is asked to keep at most, unless ``BUDGET_ENV`` says otherwise.
DEFAULT_BUDGET = 1 << 30
ENABLED_ENV = "SKYWARD_SHARED_ARGS"
BUDGET_ENV = "SKYWARD_SHARED_BUDGET"


def enabled() -> bool:
    """Whether large arguments are shared (``SKYWARD_SHARED_ARGS`` is not off)."""
    return switched_on(ENABLED_ENV)


def client_budget() -> int:
    """The bytes this client asks each agent to keep at most; ``ConfigError`` when
    ``SKYWARD_SHARED_BUDGET`` is not a whole number of bytes (checked by ``sky.Compute``
    before anything is provisioned)."""
    configured = os.environ.get(BUDGET_ENV, "").strip()
    if not configured:
        return DEFAULT_BUDGET
    try:
        return max(0, int(configured))
    except ValueError:
        raise ConfigError(f"{BUDGET_ENV}={configured!r}: give the bytes each node may keep "
                          f"for shared arguments as a whole number (e.g. {DEFAULT_BUDGET})"
                          ) from None


def digest(buffer: Any) -> bytes:
    """The digest naming a buffer's bytes (xxh3-128: see the module doc for why)."""
    return xxhash.xxh3_128_digest(buffer)


@dataclass(frozen=True, slots=True, eq=False)
class Shareable:
    """A large buffer of a call and its digest; ``SharedBuffers.for_agent`` turns it into
    what the wire carries (the bytes, ``Keep`` or ``Use``)."""

    digest: bytes
    buffer: Any
    nbytes: int


class _Snapshot(bytearray):
    """A call's copy of a buffer, findable by digest while a call holds it (weakly kept)."""


_snapshots: weakref.WeakValueDictionary[bytes, _Snapshot] = weakref.WeakValueDictionary()
_snapshots_lock = threading.Lock()
#: Objects whose buffers calls carried lately: ``(id, size) -> weak reference``.
_seen: OrderedDict[tuple[int, int], weakref.ref[Any]] = OrderedDict()
#: How many such objects are remembered.
SEEN_KEPT = 256


class BatchDigests:
    """Digests of whole objects, for calls whose caller waits for all of them (``copy=False``):
    their buffers cannot change meanwhile, so one object is digested once. Each object is held
    while the batch is, so its ``id`` names it alone."""

    def __init__(self) -> None:
        self._known: dict[tuple[int, int], tuple[Any, bytes]] = {}

    def digest(self, view: memoryview) -> bytes:
        owner = view.obj
        try:
            with memoryview(owner) as whole:
                entire = whole.nbytes == view.nbytes  # a part could start anywhere in it
        except TypeError:
            entire = False
        if not entire:
            return digest(view)
        key = (id(owner), view.nbytes)
        known = self._known.get(key)
        if known is None:
            known = self._known[key] = (owner, digest(view))
        return known[1]


def prepare(views: Sequence[Any], copy: bool,
            digests: BatchDigests | None = None) -> tuple[Any, ...]:
    """A call's out-of-band buffers (views of the caller's objects) as the call keeps them:
    copied when ``copy`` (a snapshot shared with calls of equal bytes), large ones wrapped as
    ``Shareable``; ``digests`` only for a call without snapshot whose caller waits."""
    if not enabled():
        return tuple(bytearray(view) if copy else view for view in views)
    prepared: list[Any] = []
    for view in views:
        size = memoryview(view).nbytes
        # A waiting batch digests each object at once, once: its calls come together.
        if size < SHARE_MIN or (not _seen_before(view) and digests is None):
            prepared.append(bytearray(view) if copy else view)
            continue
        if copy or digests is None:
            name = digest(view)
        else:
            name = digests.digest(memoryview(view))
        prepared.append(Shareable(name, _snapshot(name, view) if copy else view, size))
    return tuple(prepared)


def _seen_before(view: Any) -> bool:
    """Whether a call carried this buffer's object before (an object that cannot be referred
    to weakly counts as seen: it is always digested)."""
    owner = memoryview(view).obj
    try:
        ref = weakref.ref(owner)
    except TypeError:
        return True
    key = (id(owner), memoryview(view).nbytes)
    with _snapshots_lock:
        known = _seen.get(key)
        if known is not None and known() is owner:  # alive: the same object, not a reused id
            _seen.move_to_end(key)
            return True
        _seen[key] = ref
        while len(_seen) > SEEN_KEPT:
            _seen.popitem(last=False)
        return False


def _snapshot(name: bytes, view: Any) -> _Snapshot:
    """A copy of ``view``: an existing one of the same bytes when a call still holds it."""
    with _snapshots_lock:
        existing = _snapshots.get(name)
    if existing is not None:
        return existing
    copied = _Snapshot(view)
    with _snapshots_lock:
        return _snapshots.setdefault(name, copied)


def plain(buffers: Sequence[Any]) -> tuple[Any, ...]:
    """The buffers as bytes to send whole (no sharing)."""
    return tuple(b.buffer if isinstance(b, Shareable) else b for b in buffers)


class SharedBuffers:
    """What one agent connection's agent holds for this client, at most ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self._held: OrderedDict[bytes, int] = OrderedDict()
        #: Held from giving tasks their references to sending them: the agent must see them
        #: in this order.
        self.lock = threading.Lock()

    def held(self) -> dict[bytes, int]:
        """The digests the agent holds for this connection, least recently used first."""
        return dict(self._held)

    def for_agent(self, tasks: Sequence[Task]) -> Sequence[Task]:
        """``tasks`` as the agent is sent them (call with ``lock`` held, then send them before
        letting go): each ``Shareable`` becomes its bytes, a ``Keep`` or a ``Use``."""
        if not _shares(tasks):
            return tasks
        share = enabled() and self.budget > 0
        return [dataclasses.replace(task, buffers=self._refs(task.buffers, share))
                if task.buffers else task for task in tasks]

    def _refs(self, buffers: Sequence[Any], share: bool) -> tuple[Any, ...]:
        refs: list[Any] = []
        for buffer in buffers:
            if not isinstance(buffer, Shareable):
                refs.append(buffer)
            elif not share or buffer.nbytes > self.budget:
                refs.append(buffer.buffer)
            elif buffer.digest in self._held:
                self._held.move_to_end(buffer.digest)
                refs.append(Use(buffer.digest, buffer.nbytes))
            else:
                evict = self._make_room(buffer.nbytes)
                self._held[buffer.digest] = buffer.nbytes
                self.used += buffer.nbytes
                refs.append(Keep(buffer.digest, buffer.buffer, evict))
        return tuple(refs)

    def _make_room(self, size: int) -> tuple[bytes, ...]:
        """Forget the least recently used digests until ``size`` more bytes fit the budget
        (pure bookkeeping: the agent forgets them when it reads the ``Keep`` naming them)."""
        evicted: list[bytes] = []
        while self._held and self.used + size > self.budget:
            name, held = self._held.popitem(last=False)
            self.used -= held
            evicted.append(name)
        return tuple(evicted)


#: Each agent connection's ``SharedBuffers``, by its channel (they go together).
_connections: weakref.WeakKeyDictionary[Any, SharedBuffers] = weakref.WeakKeyDictionary()


def of(channel: Any, welcome: Any = None) -> SharedBuffers:
    """The ``SharedBuffers`` of the agent connection ``channel`` is, made on first use with
    this client's budget within the cap its agent told in ``welcome`` (none: nothing kept)."""
    with _snapshots_lock:
        shared = _connections.get(channel)
        if shared is None:
            cap = getattr(welcome, "shared_cap", 0)
            shared = _connections[channel] = SharedBuffers(min(client_budget(), cap))
        return shared


def send(channel: Any, tasks: Sequence[Task], welcome: Any) -> None:
    """Send ``tasks`` in one frame on ``channel`` (a ``protocol.Channel`` to the agent that
    said ``welcome``), each large argument as its bytes, a ``Keep`` or a ``Use``: given and sent
    under one lock, so the agent reads them in the order the references assume. A frame with
    no large argument (most) refers to nothing: it is sent as it is, in any order."""
    if not _shares(tasks):
        channel.send_many(tasks)
        return
    shared = of(channel, welcome)
    with shared.lock:
        channel.send_many(shared.for_agent(tasks))


def _shares(tasks: Sequence[Task]) -> bool:
    """Whether any of ``tasks`` carries a ``Shareable`` (checked per send: most carry none)."""
    for task in tasks:
        for buffer in task.buffers:
            if isinstance(buffer, Shareable):
                return True
    return False
