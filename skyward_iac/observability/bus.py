"""``EventBus``: deliver events to subscribers, from any thread, without one breaking another.

Delivery is synchronous in the emitting thread, in subscription order. A subscriber that raises
is logged (its first failure with the traceback, later ones at DEBUG, since a broken metrics
callback would otherwise log every second) and the others still get the event.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from skyward_iac.observability.events import Event

log = logging.getLogger("skyward.events")

Callback = Callable[[Any], Any]


class Subscription:
    """The handle ``subscribe`` returns: call it (or ``cancel()``) to unsubscribe; idempotent."""

    __slots__ = ("_bus", "callback", "failures", "types")

    def __init__(self, bus: EventBus, callback: Callback, types: tuple[type[Event], ...]) -> None:
        self._bus: EventBus | None = bus
        self.callback = callback
        self.types = types
        self.failures = 0

    def wants(self, event: Event) -> bool:
        """Whether this subscriber asked for events of ``event``'s type."""
        return not self.types or isinstance(event, self.types)

    def cancel(self) -> None:
        """Stop delivering events to this subscriber."""
        bus, self._bus = self._bus, None
        if bus is not None:
            bus._remove(self)

    def __call__(self) -> None:
        self.cancel()

    def __repr__(self) -> str:
        types = ", ".join(t.__name__ for t in self.types) or "all events"
        return f"<Subscription {getattr(self.callback, '__qualname__', self.callback)!r}: {types}>"


class EventBus:
    """Thread-safe publish/subscribe for pool events.

    ``bus.subscribe(print)`` gets every event; ``bus.subscribe(fn, Metric, Log)`` only those
    types (and their subclasses). ``bus.emit(event)`` delivers it to each matching subscriber.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Copy-on-write: emit() reads the tuple without the lock, so a subscriber may
        # (un)subscribe or emit from inside its callback without deadlocking.
        self._subscriptions: tuple[Subscription, ...] = ()

    def subscribe(self, callback: Callback, *types: type[Event]) -> Subscription:
        """Call ``callback(event)`` for every event of ``types`` (all events when none given)."""
        if not callable(callback):
            raise TypeError(f"an event callback must be callable, got {callback!r}")
        for kind in types:
            if not (isinstance(kind, type) and issubclass(kind, Event)):
                raise TypeError(f"subscribe to event classes such as sky.Metric, got {kind!r}")
        subscription = Subscription(self, callback, types)
        with self._lock:
            self._subscriptions = (*self._subscriptions, subscription)
        return subscription

    def _remove(self, subscription: Subscription) -> None:
        with self._lock:
            self._subscriptions = tuple(s for s in self._subscriptions if s is not subscription)

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

    def __len__(self) -> int:
        return len(self._subscriptions)
