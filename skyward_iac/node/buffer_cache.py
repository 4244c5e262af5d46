"""The buffers an agent keeps for one client connection: large arguments shared by many tasks.

The client decides what is kept and what is forgotten (remote/shared_buffers.py: a byte budget,
least recently used first) and says so in its tasks (``Keep``, ``Use``, node/shared_refs.py), so
both ends agree without a round trip. The agent only obeys, within a hard cap of its own
(``SKYWARD_SHARED_CAP`` bytes per connection, told to the client in ``Welcome``): a ``Keep``
beyond it is run but not kept, and a task referring to a digest the connection does not hold
(never kept, forgotten, or refused) fails alone with ``SharedArgumentError``; the agent and
the connection go on. Everything kept is freed when the connection ends (``clear``).

One connection's frames are dispatched one at a time, in order, so a cache is used by one
thread at a time.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import OrderedDict
from typing import Any

from skyward_iac.api.errors import SkywardError
from skyward_iac.node.buffer_maps import Kept
from skyward_iac.node.messages import Task
from skyward_iac.node.shared_refs import DIGEST_SIZE, IN_BAND, Keep, Mapped, Use

log = logging.getLogger("skyward.agent")

#: The environment variable that sets the agent's cap (bytes kept per connection).
CAP_ENV = "SKYWARD_SHARED_CAP"
#: The cap unless set: 2 GiB, or a quarter of the node's memory if that is less.
DEFAULT_CAP = 2 << 30
#: Refused digests remembered per connection, to say why a later reference fails.
_REFUSED_KEPT = 1024


class SharedArgumentError(SkywardError):
    """A task referred to a shared argument its node does not hold."""


def agent_cap() -> int:
    """The agent's cap on the bytes it keeps per connection (pure of everything but the
    environment and the machine's memory)."""
    configured = os.environ.get(CAP_ENV)
    if configured:
        return max(0, int(configured))
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return DEFAULT_CAP
    return min(DEFAULT_CAP, memory // 4)


class BufferCache:
    """What one connection's client asked the agent to keep, at most ``cap`` bytes."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.used = 0
        self._kept: OrderedDict[bytes, Kept] = OrderedDict()
        self._refused: OrderedDict[bytes, int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def resolve(self, task: Task) -> Task:
        """``task`` with its ``Keep`` and ``Use`` replaced by the buffers they stand for (a
        ``Kept`` for a use). Every ``Keep`` takes effect, even when the task then fails:
        ``SharedArgumentError`` for a reference to a digest this connection does not hold."""
        if not task.buffers or not any(isinstance(b, IN_BAND) for b in task.buffers):
            return task  # most tasks: nothing to look at
        buffers: list[Any] = []
        missing: list[str] = []
        for buffer in task.buffers:
            if isinstance(buffer, Keep):
                # Kept: this task maps the same memfd as the later ones (node/buffer_maps.py).
                buffer = self._keep(buffer) or buffer.buffer
            elif isinstance(buffer, Mapped):  # the agent's to its workers, never a client's
                missing.append("a client's task cannot carry a Mapped buffer")
            elif isinstance(buffer, Use):
                digest = buffer.digest
                kept = self._kept.get(digest) if isinstance(digest, bytes) else None
                if kept is None:
                    missing.append(self._why_missing(buffer))
                buffer = kept
            buffers.append(buffer)
        if missing:
            raise SharedArgumentError(f"task {task.task_id} ({task.name}): " + "; ".join(missing))
        return dataclasses.replace(task, buffers=tuple(buffers))

    def clear(self) -> None:
        """The connection ended: let go of everything it kept (tasks still queued keep theirs
        until they are done)."""
        self._kept.clear()
        self._refused.clear()
        self.used = 0

    def _keep(self, keep: Keep) -> Kept | None:
        """Keep ``keep``'s buffer (None: refused, over the cap)."""
        for digest in keep.evict:
            evicted = self._kept.pop(digest, None)
            if evicted is not None:
                self.used -= evicted.size
        digest = keep.digest
        if not isinstance(digest, bytes) or len(digest) != DIGEST_SIZE:
            raise SharedArgumentError(f"a shared argument's digest must be {DIGEST_SIZE} bytes")
        try:
            kept = Kept(keep.buffer)
        except TypeError as exc:  # not a buffer: a broken client
            raise SharedArgumentError(f"a shared argument must be a buffer: {exc}") from exc
        previous = self._kept.pop(digest, None)
        if previous is not None:
            self.used -= previous.size
        if self.used + kept.size > self.cap:
            self._refuse(digest, kept.size)
            return None
        self._kept[digest] = kept
        self.used += kept.size
        return kept

    def _refuse(self, digest: bytes, size: int) -> None:
        log.warning("not keeping a shared argument of %d bytes: this connection holds %d of "
                    "its %d (%s)", size, self.used, self.cap, CAP_ENV)
        self._refused[digest] = size
        while len(self._refused) > _REFUSED_KEPT:
            self._refused.popitem(last=False)

    def _why_missing(self, use: Use) -> str:
        if not isinstance(use.digest, bytes):
            return "a shared argument's digest must be bytes"
        name = f"shared argument {use.digest.hex()} ({use.size} bytes)"
        if use.digest in self._refused:
            return (f"{name} was not kept: this node keeps at most {self.cap} bytes of shared "
                    f"arguments per client ({CAP_ENV}), {self.used} are in use")
        return f"{name} is not held by this node (never sent on this connection, or forgotten)"
