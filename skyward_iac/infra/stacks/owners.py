"""Whose is a stack: its owner judged from this machine, without comparing two machines' clocks.

One judgement for every caller that must know whether a stack's owner may still use it: gc
(``gc.collect_reason``), the one destroy path (``destroy.py``, through ``takedown.refusal``)
and ``ls``. ``owner_state`` and ``lease_reason`` are pure over a ``Look`` (this machine's
clocks, host, boot and processes); ``look`` takes one, reading the processes and the lease
sightings of this machine.

* the owner was a process of this machine (same host and boot): it runs or not, and so does
  any holder recorded here (an adopter, a keeper: ``leases.hold``);
* another machine's owner is judged by its lease, as this machine sees it (unrenewed for a
  lease on this machine's monotonic clock, or, at a first look, ended more than
  ``MAX_CLOCK_SKEW`` ago: ``api/deadlines.py``).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from skyward_iac.api.deadlines import LeaseSighting, lease_lapsed
from skyward_iac.infra.stacks import leases
from skyward_iac.infra.stacks.leases import LEASE_UNTIL
from skyward_iac.infra.stacks.tags import ProcessId, StackRecord, boot_id, process_started
from skyward_iac.processes import is_alive

#: What ``owner_state`` says of a stack's owner.
RUNNING, DEAD, ELSEWHERE = "running", "dead", "elsewhere"


def _nobody(stack: str) -> list[ProcessId]:
    return []


@dataclass(frozen=True, slots=True)
class Look:
    """One look at the stacks from this machine: its wall and monotonic clocks, which machine
    and boot it is, whether a pid (with its start time) runs here, the holders recorded here
    and the leases' sightings."""

    now: datetime
    host: str
    alive: Callable[[int, str], bool]
    boot: str = ""
    mono: float = 0.0
    holders: Callable[[str], list[ProcessId]] = _nobody
    sightings: Mapping[str, LeaseSighting] = field(default_factory=dict)

    def here(self, process: ProcessId) -> bool:
        """Whether ``process`` ran on this machine in this boot (a record without a boot, from
        an older version: on this host)."""
        return process.host == self.host and (not process.boot or process.boot == self.boot)

    def runs(self, process: ProcessId) -> bool:
        """Whether ``process`` is a process of this machine that still runs."""
        return self.here(process) and self.alive(process.pid, process.started)


def owner_state(record: StackRecord, look: Look) -> str:
    """``RUNNING`` (its creator or a recorded holder runs here), ``DEAD`` (its creator was a
    process of this machine, gone, and nothing here holds it) or ``ELSEWHERE``."""
    if any(look.runs(holder) for holder in look.holders(record.name)):
        return RUNNING
    creator = ProcessId.from_tags(record.tags)
    if creator is None:  # no pid recorded: only the host tells
        return DEAD if record.tags.get("host") == look.host else ELSEWHERE
    if not look.here(creator):
        return ELSEWHERE
    return RUNNING if look.alive(creator.pid, creator.started) else DEAD


def lease_reason(record: StackRecord, look: Look) -> str | None:
    """Why another machine's lease on ``record`` counts as lapsed here, or None while it
    holds (or there is none)."""
    until = record.tags.get(LEASE_UNTIL)
    if not until:
        return None
    sighting = look.sightings.get(record.name) or LeaseSighting(until, look.mono, look.boot)
    return lease_lapsed(until, float(record.tags.get("ttl") or 0), look.now, sighting, look.mono)


def pid_alive(pid: int, started: str) -> bool:
    """Whether ``pid`` runs and is the process that started at ``started`` (not a reuse)."""
    return is_alive(pid) and (not started or process_started(pid) == started)


def look(records: Iterable[StackRecord]) -> Look:
    """A look from this machine now at ``records``: their leases are sighted (and the
    sightings remembered for the next look)."""
    mono = time.monotonic()
    here = Look(datetime.now(UTC), socket.gethostname(), pid_alive, boot_id(), mono)
    live = {r.name: r.tags[LEASE_UNTIL] for r in records
            if r.resource_count and r.tags.get(LEASE_UNTIL)}
    return replace(here, holders=lambda stack: leases.holders(stack, here.runs),
                   sightings=leases.sight_leases(live, mono, here.boot))
