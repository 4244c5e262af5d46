"""``EventBus``: deliver events to subscribers, from any thread, without one breaking another.

Delivery is synchronous in the emitting thread, in subscription order. A subscriber that raises
is logged (its first failure with the traceback, later ones at DEBUG, since a broken metrics
callback would otherwise log every second) and the others still get the event.

A *summary* subscriber (a console) skips the per-task events of successful calls and follows
``TaskProgress`` instead; ``bus.task_detail`` tells the pool whether anyone still wants them,
so that a 10,000-task ``map`` watched only by a console builds none.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from skyward_iac.observability.events import Event, TaskCompleted, TaskQueued, TaskStarted
from skyward_iac.observability.logging import SHOWN

log = logging.getLogger("skyward.events")

Callback = Callable[[Any], Any]

#: The events a summary subscriber does not get (with ``TaskCompleted`` of a success).
TASK_DETAIL: tuple[type[Event], ...] = (TaskQueued, TaskStarted, TaskCompleted)


def is_task_detail(event: Event) -> bool:
    """Whether ``event`` is one a summary subscriber skips: a call queued, started or done."""
    return isinstance(event, TaskQueued | TaskStarted) or (
        isinstance(event, TaskCompleted) and event.success)


class Subscription:
    """The handle ``subscribe`` returns: call it (or ``cancel()``) to unsubscribe; idempotent."""

    __slots__ = ("_bus", "callback", "failures", "summary", "types")

    def __init__(self, bus: EventBus, callback: Callback, types: tuple[type[Event], ...],
                 summary: bool = False) -> None:
        self._bus: EventBus | None = bus
        self.callback = callback
        self.types = types
        self.summary = summary
        self.failures = 0

    def wants(self, event: Event) -> bool:
        """Whether this subscriber asked for events of ``event``'s type."""
        if self.summary and is_task_detail(event):
            return False
        return not self.types or isinstance(event, self.types)

    @property
    def wants_task_detail(self) -> bool:
        """Whether it asked for per-task events (all events, or one of the task types)."""
        return not self.summary and (not self.types or any(
            issubclass(task, kind) for task in TASK_DETAIL for kind in self.types))

    def cancel(self) -> None:
        """Stop delivering events to this subscriber."""
        bus, self._bus = self._bus, None
        if bus is not None:
            bus._remove(self)

    def __call__(self) -> None:
        self.cancel()

    def __repr__(self) -> str:
        types = ", ".join(t.__name__ for t in self.types) or "all events"
        if self.summary:
            types += " (summary)"
        return f"<Subscription {getattr(self.callback, '__qualname__', self.callback)!r}: {types}>"


class EventBus:
    """Thread-safe publish/subscribe for pool events.

    ``bus.subscribe(print)`` gets every event; ``bus.subscribe(fn, Metric, Log)`` only those
    types (and their subclasses); ``summary=True`` leaves out the per-task events of successful
    calls. ``bus.emit(event)`` delivers it to each matching subscriber.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Copy-on-write: emit() reads the tuple without the lock, so a subscriber may
        # (un)subscribe or emit from inside its callback without deadlocking.
        self._subscriptions: tuple[Subscription, ...] = ()
        self._task_detail = False

    @property
    def task_detail(self) -> bool:
        """Whether a subscriber wants per-task events (read without a lock, on the hot path)."""
        return self._task_detail

    def subscribe(self, callback: Callback, *types: type[Event],
                  summary: bool = False) -> Subscription:
        """Call ``callback(event)`` for every event of ``types`` (all events when none given).

        ``summary``: skip ``TaskQueued``, ``TaskStarted`` and successful ``TaskCompleted``
        (``TaskProgress`` counts them), as a console does.
        """
        if not callable(callback):
            raise TypeError(f"an event callback must be callable, got {callback!r}")
        for kind in types:
            if not (isinstance(kind, type) and issubclass(kind, Event)):
                raise TypeError(f"subscribe to event classes such as sky.Metric, got {kind!r}")
        subscription = Subscription(self, callback, types, summary)
        with self._lock:
            self._publish((*self._subscriptions, subscription))
        return subscription

    def _remove(self, subscription: Subscription) -> None:
        with self._lock:
            self._publish(tuple(s for s in self._subscriptions if s is not subscription))

    def _publish(self, subscriptions: tuple[Subscription, ...]) -> None:
        """Swap in the new subscriber list (with ``_lock`` held)."""
        self._subscriptions = subscriptions
        self._task_detail = any(s.wants_task_detail for s in subscriptions)

    def listens(self, kind: type[Event]) -> bool:
        """Whether a subscriber other than a summary one (a console) wants ``kind`` events;
        the pool builds events nobody reads (a ``Log`` per output line) only when one does."""
        return any(not s.summary and (not s.types or issubclass(kind, s.types))
                   for s in self._subscriptions)

    def emit(self, event: Event) -> None:
        """Deliver ``event`` to every matching subscriber; a failing one is logged, not raised."""
        for subscription in self._subscriptions:
            if not subscription.wants(event):
                continue
            try:
                subscription.callback(event)
            except Exception:  # noqa: BLE001 - one subscriber must not break the others
                subscription.failures += 1
                level = logging.WARNING if subscription.failures == 1 else logging.DEBUG
                log.log(level, "event subscriber %r failed on %s", subscription,
                        type(event).__name__, exc_info=True)

    def report(self, event: Event, logger: logging.Logger, level: int, message: str,
               *args: Any) -> None:
        """Emit ``event`` (a failure) and log ``message`` once where people look: when a
        console shows the event, the record goes to the log file only (``logging.SHOWN``),
        not echoed to stderr beside the console's own line; with no console it is echoed."""
        shown = any(s.summary and s.wants(event) for s in self._subscriptions)
        logger.log(level, message, *args, extra=SHOWN if shown else None)
        self.emit(event)

    def __len__(self) -> int:
        return len(self._subscriptions)
