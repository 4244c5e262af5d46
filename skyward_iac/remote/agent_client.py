"""The client's end of one node's agent connection: submit tasks, get futures back.

A reader thread resolves futures as results arrive; a deadline thread fails tasks that exceed
their timeout (``TimeoutError`` naming the function and limit) and tells the agent to drop them.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import cloudpickle

from skyward_iac.api.errors import NodeConnectionError, RemoteError, SkywardError
from skyward_iac.remote import protocol
from skyward_iac.remote.protocol import (
    ByteStream,
    Cancel,
    Configure,
    Failure,
    Output,
    Result,
    Task,
    Welcome,
)


class AgentClient:
    """A multiplexed task connection to one node's agent."""

    def __init__(self, stream: ByteStream, token: str, node: int,
                 on_output: Callable[[int, str, str], Any] | None = None,
                 on_lost: Callable[[int], Any] | None = None) -> None:
        self.node = node
        self._on_output = on_output
        self._on_lost = on_lost
        self._stream = stream
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[Future[Any], str]] = {}
        self._deadlines: list[tuple[float, int, float]] = []
        self._deadline_wakeup = threading.Condition()
        self._closed = False
        protocol.send(stream, protocol.encode_raw(token.encode()))
        welcome = protocol.read_message(stream)
        if not isinstance(welcome, Welcome):
            raise NodeConnectionError(f"node {node}: unexpected agent greeting {welcome!r}")
        self.welcome = welcome
        threading.Thread(target=self._read_results, name=f"agent-{node}-reader", daemon=True).start()
        threading.Thread(target=self._expire_deadlines, name=f"agent-{node}-deadlines",
                         daemon=True).start()

    @property
    def in_flight(self) -> int:
        """Tasks sent and not finished yet."""
        return len(self._pending)

    def configure(self, instance: dict[str, Any], collections: Any = None) -> None:
        """Tell the agent, before any task, the node's ``InstanceInfo`` (as a dict) and the
        ``collections.BackendConfig`` its tasks use (None: no collections)."""
        with self._send_lock:
            protocol.send(self._stream, protocol.encode(Configure(instance, collections)))

    def submit(self, name: str, payload: bytes, timeout: float | None) -> Future[Any]:
        """Send one task (``payload`` = pickled ``(fn, args, kwargs)``); returns its future."""
        if self._closed:
            raise NodeConnectionError(f"node {self.node}: connection is closed")
        task_id = next(self._ids)
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()
        self._pending[task_id] = (future, name)
        if timeout is not None:
            with self._deadline_wakeup:
                heapq.heappush(self._deadlines, (time.monotonic() + timeout, task_id, timeout))
                self._deadline_wakeup.notify()
        frames = protocol.encode(Task(task_id, name, payload, timeout))
        try:
            with self._send_lock:
                protocol.send(self._stream, frames)
        except OSError as exc:
            self._pending.pop(task_id, None)
            raise NodeConnectionError(f"node {self.node}: sending {name} failed: {exc}") from exc
        return future

    def close(self) -> None:
        """Stop; tasks still pending fail with ``NodeConnectionError``."""
        self._closed = True
        with self._deadline_wakeup:
            self._deadline_wakeup.notify()
        close = getattr(self._stream, "close", None)
        if close:
            close()
        self._fail_all(NodeConnectionError(f"node {self.node}: pool closed"))

    def _read_results(self) -> None:
        try:
            while True:
                message = protocol.read_message(self._stream)
                if isinstance(message, Result):
                    self._resolve(message)
                elif isinstance(message, Output) and self._on_output is not None:
                    self._on_output(self.node, message.stream, message.text)
        except (protocol.ConnectionClosed, OSError, EOFError) as exc:
            if not self._closed:
                self._closed = True
                self._fail_all(NodeConnectionError(f"node {self.node}: agent connection lost: {exc}"))
                if self._on_lost is not None:
                    self._on_lost(self.node)

    def _resolve(self, result: Result) -> None:
        entry = self._pending.pop(result.task_id, None)
        if entry is None:
            return  # timed out already
        future, name = entry
        if future.done():
            return
        if result.failure is not None:
            future.set_exception(rebuild_exception(result.failure, self.node))
            return
        try:
            future.set_result(cloudpickle.loads(result.value or b""))
        except ModuleNotFoundError as exc:
            future.set_exception(SkywardError(
                f"the result of {name} from node {self.node} needs module {exc.name!r}, which "
                f"is not installed on this client: install it here to receive this result"
            ))
        except Exception as exc:
            future.set_exception(SkywardError(
                f"the result of {name} from node {self.node} cannot be unpickled here: {exc!r}"
            ))

    def _expire_deadlines(self) -> None:
        while not self._closed:
            with self._deadline_wakeup:
                while not self._closed and (
                    not self._deadlines or self._deadlines[0][0] > time.monotonic()
                ):
                    wait = self._deadlines[0][0] - time.monotonic() if self._deadlines else None
                    self._deadline_wakeup.wait(wait)
                if self._closed:
                    return
                _, task_id, limit = heapq.heappop(self._deadlines)
            entry = self._pending.pop(task_id, None)
            if entry is None:
                continue
            future, name = entry
            future.set_exception(TimeoutError(
                f"{name} did not finish within its timeout of {limit:g}s on node {self.node}"
            ))
            try:
                with self._send_lock:
                    protocol.send(self._stream, protocol.encode(Cancel(task_id)))
            except OSError:
                pass

    def _fail_all(self, error: Exception) -> None:
        pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(error)


def rebuild_exception(failure: Failure, node: int) -> BaseException:
    """The remote exception with its type when it can be rebuilt, else a ``RemoteError``;
    either way the remote traceback is attached (as a note and ``remote_traceback``)."""
    exc: BaseException | None = None
    if failure.exception is not None:
        try:
            exc = cloudpickle.loads(failure.exception)
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        exc = RemoteError(failure.type_name, failure.message, failure.traceback)
    exc.add_note(f"\nRemote traceback (node {node}):\n{failure.traceback.rstrip()}")
    try:
        exc.remote_traceback = failure.traceback  # type: ignore[attr-defined]
    except AttributeError:
        pass
    return exc
