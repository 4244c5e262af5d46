"""Task events of a pool, built only when someone listens.

Anyone listening gets ``TaskProgress`` and failures; ``TaskQueued``/``TaskStarted`` and
successful ``TaskCompleted`` only when a subscriber asked for them (``EventBus.task_detail``),
since a 10,000-task ``map`` would otherwise build 30,000. Watching allocates nothing per call
(one shared callback, calls found by their future): every object more per call makes the
garbage collector run more often, and it costs the client several times what the object does.

The done-callback is a ``Done`` that the agent client may run on its wire loop for a call that
succeeded (``done_on_loop``) when all there is to do is count it: nobody asked for each task's
events and a ``TaskProgress`` report is already scheduled. Anything more (an event to emit, a
report timer to start) runs where any done-callback runs, off the loop. Handing every call to
a callback thread to be counted made a console about double the client's CPU per round trip.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from typing import TYPE_CHECKING, Any

from skyward_iac.observability.bus import EventBus
from skyward_iac.observability.events import TaskCompleted, TaskQueued, TaskStarted
from skyward_iac.observability.task_progress import TaskTally
from skyward_iac.orchestration.identity import PoolIdentity
from skyward_iac.remote.agent_client import Submission

if TYPE_CHECKING:
    from skyward_iac.orchestration.dispatch import Call


class TaskEvents:
    """Emits a pool's task events on ``bus`` (see the module doc)."""

    def __init__(self, identity: PoolIdentity, bus: EventBus,
                 load: Callable[[], tuple[int, int]]) -> None:
        self.identity = identity
        self.bus = bus
        #: Counts calls for ``TaskProgress`` while anyone listens.
        self.tally = TaskTally(identity, load, bus.emit)
        #: Unfinished calls someone listens to, by their future.
        self._watched: dict[Future[Any], Call] = {}
        self._done = Done(self)

    def watch(self, calls: list[Call]) -> None:
        """Follow ``calls`` until they finish (nothing when nobody listens)."""
        if not len(self.bus):
            return
        detail = self.bus.task_detail
        emit, stack, watched, completed = self.bus.emit, self.identity.stack, self._watched, \
            self._done
        for call in calls:
            if detail:
                emit(TaskQueued(stack, call.task_id, call.name, call.node))
            watched[call.future] = call
            call.future.add_done_callback(completed)

    def changed(self) -> None:
        """Calls were queued or moved: a ``TaskProgress`` will follow."""
        if len(self.bus):
            self.tally.changed()

    def started(self, node: int, submission: Submission) -> None:
        """A worker on ``node`` started ``submission`` (called by its agent client)."""
        if self.bus.task_detail:
            self.bus.emit(TaskStarted(self.identity.stack, submission.task_id, submission.name,
                                      node))

    def _completed(self, future: Future[Any]) -> None:
        call = self._watched.pop(future)
        try:
            exc = future.exception()
        except CancelledError:
            error: str | None = "cancelled"
        else:
            error = None if exc is None else f"{type(exc).__name__}: {exc}"
        if error is not None or self.bus.task_detail:
            self.bus.emit(TaskCompleted(
                self.identity.stack, call.task_id, call.name,
                call.sent_to if call.sent_to is not None else -1, error is None,
                call.duration or 0.0, error))
        self.tally.completed(error is None)

    def _counted(self, future: Future[Any]) -> bool:
        """``future`` succeeded: count it if that is all there is to do (see the module doc)."""
        if self.bus.task_detail or not self.tally.counted_if_reporting(True):
            return False
        self._watched.pop(future, None)
        return True

    def flush(self) -> None:
        """Report the final counts now (the pool is closing, before the console stops)."""
        self.tally.flush()


class Done:
    """The done-callback of every call a ``TaskEvents`` watches (one object, shared)."""

    __slots__ = ("events",)

    def __init__(self, events: TaskEvents) -> None:
        self.events = events

    def __call__(self, future: Future[Any]) -> None:
        self.events._completed(future)

    def quiet_on_loop(self) -> bool:
        """Whether nobody asked for each task's events (``TaskStarted`` is not emitted)."""
        return not self.events.bus.task_detail

    def done_on_loop(self, future: Future[Any]) -> bool:
        """For the agent client's wire loop, ``future`` having succeeded: done here when it
        only counts (no event, no thread to start); False: call this callback elsewhere."""
        return self.events._counted(future)
