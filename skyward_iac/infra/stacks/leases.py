"""Leases: while a pool lives, its owner keeps moving the stack's ``lease_until`` tag forward,
and ``gc`` from any machine collects a stack only once its lease has lapsed.

A lease lasts ``lease_seconds(ttl)`` and is renewed every ``renew_interval(ttl)`` (a third of
it), so one missed renewal never lets it lapse; a pool with ``ttl=0`` has no lease and never
expires. When it lapses is decided in ``api/deadlines.py`` on the collector's own clock: this
module keeps what that needs on this machine, and renews.

* ``LeaseRenewer``: the owner's thread that renews, and, while it runs, a *holder record*
  (``hold``): a file saying which process of this machine holds the stack. gc and ``ls`` on
  this machine read them to tell a live holder (an adopter of a warm pool, a keeper) from a
  dead one without looking at any clock.
* ``sight_leases``: the collector's memory of when it first saw each lease value, on its
  monotonic clock, across its runs (a file in the skyward home).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from skyward_iac.api.deadlines import LeaseSighting, lease_end, renew_interval, sight_lease
from skyward_iac.infra.stacks import home
from skyward_iac.infra.stacks.tags import ProcessId

log = logging.getLogger("skyward")

#: The tag holding the lease's end (ISO 8601, UTC, on the owner's clock).
LEASE_UNTIL = "lease_until"
#: Where this machine keeps its holder records and its lease sightings (in the skyward home).
HOLDERS, SIGHTINGS = "holders", "lease-sightings.json"


# ---- holder records: which process of this machine holds which stack --------------------------

def _holders_dir() -> Path:
    path = home.skyward_home() / HOLDERS
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def hold(stack: str) -> Path:
    """Record that this process holds ``stack`` (until ``release``); the record's path."""
    me = ProcessId.current()
    path = _holders_dir() / f"{stack}.{me.pid}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(me)))
    tmp.replace(path)
    return path


def release(record: Path | None) -> None:
    """Remove a holder record ``hold`` wrote."""
    if record is not None:
        record.unlink(missing_ok=True)


def holders(stack: str, alive: Callable[[ProcessId], bool]) -> list[ProcessId]:
    """The processes recorded as holding ``stack`` that still run (``alive``, which knows this
    machine's processes only); records of this machine's dead ones (a holder killed without a
    word) are removed as they are found. A home shared between machines keeps the others'.
    """
    me, found = ProcessId.current(), []
    for record in _holders_dir().glob("*.json"):
        if record.name.rsplit(".", 2)[0] != stack:
            continue
        try:
            holder = ProcessId(**json.loads(record.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if alive(holder):
            found.append(holder)
        elif (holder.host, holder.boot) == (me.host, me.boot):
            record.unlink(missing_ok=True)
    return found


# ---- lease sightings: when this machine first saw each lease value ----------------------------

def sight_leases(leases: Mapping[str, str], now: float, boot: str) -> dict[str, LeaseSighting]:
    """Look at ``leases`` (stack -> ``lease_until``) at ``now`` (this machine's monotonic clock
    in boot ``boot``) and return each one's sighting, remembered for the next look. Two
    collectors at once may lose one's update: that only restarts a count, never shortens it."""
    path = home.skyward_home() / SIGHTINGS
    try:
        stored = {stack: LeaseSighting(**entry)
                  for stack, entry in json.loads(path.read_text()).items()}
    except (OSError, ValueError, TypeError):
        stored = {}
    kept = {stack: seen for stack, seen in stored.items() if seen.boot == boot}
    seen = {stack: sight_lease(kept.get(stack), value, now, boot)
            for stack, value in leases.items()}
    if all(kept.get(stack) == sighting for stack, sighting in seen.items()) and \
            len(kept) == len(stored):
        return seen  # nothing new to remember
    kept.update(seen)
    tmp = path.with_name(f"{SIGHTINGS}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({stack: asdict(s) for stack, s in kept.items()}))
        tmp.replace(path)
    except OSError as exc:  # a read-only home: this look still counts, the next starts over
        log.warning("could not remember the lease sightings in %s: %s", path, exc)
    return seen


# ---- the owner's side ----------------------------------------------------------------------

class LeaseRenewer:
    """Renews a stack's lease every ``renew_interval(ttl)`` until stopped, and holds the stack
    on this machine meanwhile; a failed renewal is a warning (the next one may still land
    before the lease lapses)."""

    def __init__(self, stack_name: str, ttl: float, renew: Callable[[str], None]) -> None:
        self.stack_name, self.ttl, self._renew = stack_name, ttl, renew
        self._last: str | None = None
        self._held: Path | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{stack_name}-lease",
                                        daemon=True)

    def start(self) -> LeaseRenewer:
        try:
            self._held = hold(self.stack_name)
        except OSError as exc:  # gc on this machine then knows the stack by its tags alone
            log.warning("stack %s: could not record its holder (%s)", self.stack_name, exc)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        release(self._held)
        self._held = None

    def _run(self) -> None:
        while not self._stop.wait(renew_interval(self.ttl)):
            until = lease_end(self.ttl, datetime.now(UTC), self._last)
            try:
                self._renew(until)
                self._last = until
            except Exception as exc:  # noqa: BLE001 - retried at the next interval
                log.warning("stack %s: renewing its lease failed (%s); retrying in %.0fs",
                            self.stack_name, exc, renew_interval(self.ttl))
