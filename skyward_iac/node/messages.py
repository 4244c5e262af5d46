"""The messages of the wire protocol (node/protocol.py frames them): what the client, the agent
and its workers say to each other, and the function a call carries pickled once.

Both ends run the same skyward_iac (a warm pool is adopted only by a client with an equal
``package_digest``), so these classes travel pickled by their module path.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from skyward_iac.node.shared_refs import IN_BAND


@dataclass(frozen=True, slots=True)
class Welcome:
    """The agent's answer to a valid token; ``protocol`` is its ``PROTOCOL_VERSION``;
    ``shared_cap`` the bytes of shared arguments it keeps for this connection at most
    (node/buffer_cache.py); ``descriptors``: it takes large buffers as memfds on this
    connection (node/fd_buffers.py; absent from an older agent's, which reads as False)."""

    node: int
    pid: int
    python: str
    protocol: int
    shared_cap: int = 0
    descriptors: bool = False


@dataclass(frozen=True, slots=True)
class Configure:
    """Sent after ``Welcome``: the node's place in the pool (an ``InstanceInfo`` as a dict) and
    how its tasks reach the collections (a ``collections.BackendConfig``, or None), and the
    pool's node-side plugin hooks (a pickled tuple of ``Plugin``, or None)."""

    instance: dict[str, Any]
    collections: Any = None
    plugins: bytes | None = None


@dataclass(frozen=True, slots=True)
class Beat:
    """The client's heartbeat, over the agent connection once a node is attached: the agent
    writes ``beat COUNT`` to the node's heartbeat file (and ``budget``, when given, to the
    budget file beside it first), the same files the SFTP beats write, so the watchdog
    (node/watchdog.py) is unchanged. Each beat carries the next count, so each changes the
    file; no time of the client travels with it."""

    count: int
    #: The budget's note (``api/deadlines.py``), only when it changed since the last one told.
    budget: str | None = None


@dataclass(frozen=True, slots=True)
class Output:
    """A piece of a running task's stdout or stderr, streamed live."""

    task_id: int
    stream: str
    text: str


@dataclass(frozen=True, slots=True)
class Task:
    """Run ``payload`` (a pickled ``(fn, args, kwargs)`` whose out-of-band buffers are
    ``buffers``); ``name`` is for messages only."""

    task_id: int
    name: str
    payload: bytes
    timeout: float | None
    buffers: tuple[Any, ...] = ()

    def __reduce__(self) -> tuple[Any, ...]:
        # A plain constructor call pickles several times faster than dataclass state.
        buffers = self.buffers
        return (Task, (self.task_id, self.name, self.payload, self.timeout,
                       _out_of_band(buffers) if buffers else buffers))


@dataclass(frozen=True, slots=True)
class Started:
    """A worker took task ``task_id`` from its queue and is running it now."""

    task_id: int


@dataclass(frozen=True, slots=True)
class Cancel:
    """The client gave up on a task (timeout): its result is no longer wanted."""

    task_id: int


@dataclass(frozen=True, slots=True)
class Failure:
    """A task's exception: its type, message, remote traceback and, if picklable, itself."""

    type_name: str
    message: str
    traceback: str
    exception: bytes | None


@dataclass(frozen=True, slots=True)
class Result:
    """A task's outcome: ``value`` (a pickle whose out-of-band buffers are ``buffers``) or
    ``failure``; ``duration`` is how long the function ran on the node (seconds); ``let_go``:
    the worker holds nothing of the memfds it was handed for the task any more, so its client
    may write a lent one again (node/fd_buffers.py)."""

    task_id: int
    value: bytes | None = None
    failure: Failure | None = None
    buffers: tuple[Any, ...] = ()
    duration: float = 0.0
    let_go: bool = False

    def __reduce__(self) -> tuple[Any, ...]:
        buffers = self.buffers  # most results have none: no call
        return (Result, (self.task_id, self.value, self.failure,
                         _out_of_band(buffers) if buffers else buffers, self.duration,
                         self.let_go))


@dataclass(frozen=True, slots=True)
class MetricSamples:
    """The agent's latest ``sky.metrics`` readings (``node.sampler.MetricSample``s),
    sent to every connected client as they are taken."""

    samples: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class PreemptionNotice:
    """The node's cloud announced its interruption: it stops at ``deadline`` (epoch seconds)."""

    node: int
    deadline: float
    reason: str


@dataclass(frozen=True, slots=True)
class Batch:
    """Several messages in one frame, handled in order."""

    messages: tuple[Any, ...]


class PickledFunction:
    """A function pickled once on the client, travelling as bytes inside each call's pickle.

    A node rebuilds each distinct function once per worker process (``load_function``), so a
    ``map`` of 10,000 items pickles its function once and nodes unpickle it once. Like a
    function imported by reference, its module globals then live as long as the worker.
    """

    __slots__ = ("blob",)

    def __init__(self, blob: bytes) -> None:
        self.blob = blob

    def __reduce__(self) -> tuple[Any, ...]:
        return (load_function, (self.blob,))


_FUNCTIONS_KEPT = 256
_functions: dict[bytes, Any] = {}


def load_function(blob: bytes) -> Any:
    """The function pickled in ``blob``, unpickled at most once per process (bounded cache)."""
    fn = _functions.get(blob)
    if fn is None:
        fn = pickle.loads(blob)
        if len(_functions) >= _FUNCTIONS_KEPT:
            _functions.clear()
        _functions[blob] = fn
    return fn


#: Task buffers pickled as they are: already out of band, or references travelling in band.
_AS_IS = (pickle.PickleBuffer, *IN_BAND)


def _out_of_band(buffers: tuple[Any, ...]) -> tuple[Any, ...]:
    # PickleBuffer makes pickle hand the buffer to the frame's buffer_callback (out of band);
    # a shared argument's reference travels in band (node/shared_refs.py).
    return tuple(b if isinstance(b, _AS_IS) else pickle.PickleBuffer(b) for b in buffers)
