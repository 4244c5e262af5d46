"""Leases: while a pool lives, its owner keeps moving the stack's ``lease_until`` tag forward,
and ``gc`` from any machine collects a stack only once its lease has lapsed.

A lease lasts ``lease_seconds(ttl)`` and is renewed every ``renew_interval(ttl)`` (a third of
it), so one missed renewal never lets it lapse; a pool with ``ttl=0`` has no lease and never
expires. Policy here is pure; ``LeaseRenewer`` is the thread that acts on it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

log = logging.getLogger("skyward")

#: The tag holding the lease's end (ISO 8601, UTC) and the tag naming its holder.
LEASE_UNTIL, LEASE_HOLDER = "lease_until", "lease_holder"
#: The shortest lease: each renewal is one engine command, so not more often than every 10 s.
MIN_LEASE = 30.0


def lease_seconds(ttl: float) -> float:
    """How long one renewal keeps the stack: its ttl, at least ``MIN_LEASE``."""
    return max(float(ttl), MIN_LEASE)


def renew_interval(ttl: float) -> float:
    """How often the owner renews: a third of the lease."""
    return lease_seconds(ttl) / 3


def lease_end(ttl: float, now: datetime | None = None) -> str:
    """The ``lease_until`` value a renewal at ``now`` writes."""
    moment = (now or datetime.now(UTC)) + timedelta(seconds=lease_seconds(ttl))
    return moment.isoformat(timespec="seconds")


def lapsed(tags: dict[str, str], now: datetime) -> bool | None:
    """Whether the stack's lease has lapsed; None when it has no lease (older stacks, ttl 0)."""
    until = tags.get(LEASE_UNTIL)
    if not until:
        return None
    return datetime.fromisoformat(until) <= now


class LeaseRenewer:
    """Renews a stack's lease every ``renew_interval(ttl)`` until stopped; a failed renewal is
    a warning (the next one may still land before the lease lapses)."""

    def __init__(self, stack_name: str, ttl: float, renew: Callable[[str], None]) -> None:
        self.stack_name, self.ttl, self._renew = stack_name, ttl, renew
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{stack_name}-lease",
                                        daemon=True)

    def start(self) -> LeaseRenewer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(renew_interval(self.ttl)):
            try:
                self._renew(lease_end(self.ttl))
            except Exception as exc:  # noqa: BLE001 - retried at the next interval
                log.warning("stack %s: renewing its lease failed (%s); retrying in %.0fs",
                            self.stack_name, exc, renew_interval(self.ttl))
