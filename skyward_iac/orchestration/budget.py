"""``Options(max_cost_usd)``: a budget a pool cannot exceed.

The client's half: ``BudgetGuard`` reads the pool's ``CostMeter`` (USD from each node's
launch, at each rate the pool ran at: the guard feeds it the engine's events, ``launches``) and sleeps until the next threshold at the current rate, woken by every
change of rate (a resize, a spot fallback, a capacity failover). At 80 % it emits
``BudgetWarning`` (a console line); at 100 % ``BudgetExceeded``, and it hands the pool a
``BudgetExceededError``: the pool closes and destroys itself, and its pending calls raise it; a
stack update under way is cancelled as a Ctrl+C cancels it (``infra/engine/command.py``).

The nodes' half: with its heartbeat, each node is told how many seconds the budget leaves at
the current rate (``note``, a duration: ``api/deadlines.py``), again after every change; its
watchdog counts them down on the node's own clock and stops the node when they run out, so a
pool whose client is gone does not spend past its budget either.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from skyward_iac.api.deadlines import BUDGET_WARNING, budget_note, seconds_until_spent
from skyward_iac.api.errors import BudgetExceededError
from skyward_iac.infra.engine import command
from skyward_iac.observability.bus import EventBus
from skyward_iac.observability.events import (
    BudgetExceeded,
    BudgetWarning,
    Event,
    InstanceDestroyed,
    InstanceProvisioned,
    StackProgress,
    StackUpdated,
)
from skyward_iac.orchestration.cost import CostMeter
from skyward_iac.orchestration.identity import PoolIdentity

log = logging.getLogger("skyward")


def about(seconds: float | None) -> str:
    """A duration as a person reads it: ``40 s``, ``12 min``, ``3.5 h`` (``never``: None)."""
    if seconds is None:
        return "never at this rate"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def launches(meter: CostMeter, stack: str) -> Callable[[Event], None]:
    """An event-bus subscriber telling ``meter`` what the engine reports for ``stack``: an
    update's start and end, each node's instance created (``InstanceProvisioned``: the cloud
    bills from then) and gone."""

    def tell(event: Event) -> None:
        if getattr(event, "stack", None) != stack:
            return
        if isinstance(event, InstanceProvisioned):
            meter.launched(event.node)
        elif isinstance(event, InstanceDestroyed):
            meter.gone(event.node)
        elif isinstance(event, StackProgress) and event.operation == "up":
            meter.up_started()
        elif isinstance(event, StackUpdated):
            meter.up_ended()

    return tell


class NoBudget:
    """The notes of a pool without a budget: its nodes are told ``none`` (a warm pool adopted
    from a pool with a budget must not keep that pool's deadline)."""

    def note(self) -> tuple[int, str]:
        return 0, budget_note(None)

    def listen(self, callback: Callable[[], Any]) -> None:
        """Nothing ever changes."""


class BudgetGuard:
    """Watches one pool's spending against its budget; see the module doc.

    ``on_spent(error)`` is called once, from the guard's thread, when the budget is spent.
    """

    def __init__(self, budget_usd: float, meter: CostMeter, identity: PoolIdentity,
                 events: EventBus, on_spent: Callable[[BudgetExceededError], Any]) -> None:
        self.budget_usd = budget_usd
        self.meter = meter
        self.identity = identity
        self._events = events
        self._on_spent = on_spent
        self._wake = threading.Event()
        self._stopped = False
        #: Moves at every change of the meter: a node told an older version is told again.
        self._version = 0
        self._listeners: list[Callable[[], Any]] = []
        meter.on_change(self._changed)
        meter.track_launches()
        self._launches = events.subscribe(launches(meter, identity.stack), InstanceProvisioned,
                                          InstanceDestroyed, StackProgress, StackUpdated)
        self._thread = threading.Thread(target=self._run, name=f"{identity.stack}-budget", daemon=True)
        self._thread.start()

    # ---- what the nodes are told ----------------------------------------------------------

    def note(self) -> tuple[int, str]:
        """What each node's budget file says now, and its version: the seconds the budget
        leaves at the current rate (``none`` while the pool costs nothing)."""
        version = self._version
        spent, rate = self.meter.reading()
        return version, budget_note(seconds_until_spent(self.budget_usd, spent, rate))

    def listen(self, callback: Callable[[], Any]) -> None:
        """Call ``callback()`` after every change of the deadline (the heartbeat tells every
        node at once rather than at its next beat)."""
        self._listeners.append(callback)

    def _changed(self) -> None:
        self._version += 1
        self._wake.set()
        for callback in list(self._listeners):
            callback()

    # ---- the client's watch ---------------------------------------------------------------

    def stop(self) -> None:
        """Stop watching (the pool is closing)."""
        self._stopped = True
        self._launches.cancel()
        self._wake.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        warned = False
        while not self._stopped:
            self._wake.clear()  # before reading: a change after the read wakes the wait below
            spent, rate = self.meter.reading()
            if spent >= self.budget_usd:
                self._spent(spent, rate)
                return
            if not warned and spent >= BUDGET_WARNING * self.budget_usd:
                warned = True
                self._warn(spent, rate)
            target = self.budget_usd if warned else BUDGET_WARNING * self.budget_usd
            wait = seconds_until_spent(target, spent, rate)
            # A hair past the crossing, so the next reading is over it, not a rounding short.
            self._wake.wait(None if wait is None else wait + 0.01)

    def _warn(self, spent: float, rate: float) -> None:
        left = seconds_until_spent(self.budget_usd, spent, rate)
        message = (f"pool {self.identity.stack} has spent {spent / self.budget_usd:.0%} of its budget: "
                   f"${spent:.2f} of ${self.budget_usd:g} (at ${rate:.2f}/h, {about(left)} "
                   "left); at 100 % it is closed and destroyed")
        self._events.report(BudgetWarning(stack=self.identity.stack, message=message,
                                          budget_usd=self.budget_usd, spent_usd=spent,
                                          usd_per_hour=rate), log, logging.WARNING, "%s", message)

    def _spent(self, spent: float, rate: float) -> None:
        message = (f"pool {self.identity.stack} reached its budget: ${spent:.2f} spent of "
                   f"Options(max_cost_usd={self.budget_usd:g}) at ${rate:.2f}/h (catalog "
                   "rates); the pool is closed and its stack destroyed")
        self._events.report(BudgetExceeded(stack=self.identity.stack, message=message, fatal=True,
                                           budget_usd=self.budget_usd, spent_usd=spent,
                                           usd_per_hour=rate), log, logging.ERROR, "%s", message)
        self._on_spent(BudgetExceededError(message, budget_usd=self.budget_usd,
                                           spent_usd=spent, usd_per_hour=rate))
        # A stack update under way (a cold start's, a resize's) is stopped, not waited for:
        # it fails in its own thread, where the pool's failure (set just above) is raised.
        command.cancel(self.identity.stack, "its budget is spent")
