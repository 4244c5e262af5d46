"""What a ``Task``'s buffers may hold in place of bytes: large arguments shared by many tasks.

A client sends a large out-of-band buffer (a 100 MB array passed to 64 tasks) once per agent
connection and refers to it by digest afterwards (remote/shared_buffers.py decides which, and
when the agent must forget one); the agent keeps it (node/buffer_cache.py) and hands it to its
workers as a sealed memfd each maps privately (node/buffer_maps.py). These are the wire's forms
of that, pickled inside the ``Task`` (only ``Keep.buffer`` travels out of band):

- ``Keep(digest, buffer, evict)``, client -> agent: here are the bytes; keep them under
  ``digest`` for later tasks of this connection, after forgetting the digests in ``evict``.
- ``Use(digest, size)``, client -> agent: the bytes kept under ``digest``.
- ``Mapped(serial, size, reuse)``, agent -> worker: the bytes are in the memfd sent on the
  worker's maps socket with ``serial`` (a kept argument's, or any large buffer's that arrived
  whole: node/buffer_maps.py).

The digest is the client's business (xxh3-128 of the bytes); the agent only compares it.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

#: Bytes of a digest on the wire (xxh3-128).
DIGEST_SIZE = 16


@dataclass(frozen=True, slots=True)
class Keep:
    """Client -> agent: ``buffer``'s bytes, to keep under ``digest`` once the digests of
    ``evict`` are forgotten (the client's budget decides, so both ends agree without asking)."""

    digest: bytes
    buffer: Any
    evict: tuple[bytes, ...] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        # The bytes travel out of band, like any task buffer (messages._out_of_band).
        buffer = self.buffer
        if not isinstance(buffer, pickle.PickleBuffer):
            buffer = pickle.PickleBuffer(buffer)
        return (Keep, (self.digest, buffer, self.evict))


@dataclass(frozen=True, slots=True)
class Use:
    """Client -> agent: the buffer kept under ``digest`` on this connection (``size`` bytes,
    for messages)."""

    digest: bytes
    size: int


@dataclass(frozen=True, slots=True)
class Mapped:
    """Agent -> worker: a buffer of ``size`` bytes, whose memfd comes on the maps socket with
    ``serial`` (the worker maps it privately: a task that writes to it copies a page);
    ``reuse``: a kept argument, whose mapping may serve the worker's next task on it."""

    serial: int
    size: int
    reuse: bool = True


#: The forms pickled in band inside a ``Task`` (``messages._out_of_band`` leaves them be).
IN_BAND = (Keep, Use, Mapped)
