"""Task events of a pool, built only when someone listens.

Anyone listening gets ``TaskProgress`` and failures; ``TaskQueued``/``TaskStarted`` and
successful ``TaskCompleted`` only when a subscriber asked for them (``EventBus.task_detail``),
since a 10,000-task ``map`` would otherwise build 30,000. Watching allocates nothing per call
(one shared callback, calls found by their future): every object more per call makes the
garbage collector run more often, and it costs the client several times what the object does.
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

    def watch(self, calls: list[Call]) -> None:
        """Follow ``calls`` until they finish (nothing when nobody listens)."""
        if not len(self.bus):
            return
        detail = self.bus.task_detail
        emit, stack, watched, completed = self.bus.emit, self.identity.stack, self._watched, \
            self._completed
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

    def flush(self) -> None:
        """Report the final counts now (the pool is closing, before the console stops)."""
        self.tally.flush()
