"""Garbage collection of stacks whose client is gone: the policy (pure) and its execution.

A stack is collected when it still holds resources and its owner is gone, judged without
comparing two machines' clocks (``api/deadlines.py``):

* the owner was a process of this machine (same host and boot) and neither it nor any holder
  recorded here (an adopter, a keeper: ``leases.hold``) runs: collected at once;
* another machine's stack: once its lease lapsed, as this machine sees it (unrenewed for a
  lease on this machine's monotonic clock, or, at a first look, ended more than
  ``MAX_CLOCK_SKEW`` ago).

A warm pool is left to its keeper until ``warm_until``. Stacks without a lease (``ttl=0``, or
from before leases) keep the older rule: expired, and the owner gone. Collection clears what a
crash leaves (a stale lock, pending operations) with ``cancel`` and ``refresh``, then destroys.
Running two collectors at once is safe: the second finds the stack locked and skips it.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from skyward_iac.api.deadlines import LeaseSighting, lease_lapsed, wall_passed
from skyward_iac.api.errors import StackBusyError
from skyward_iac.infra.engine.provider_host import reap_orphans
from skyward_iac.infra.engine.state_repair import repair as repair_state
from skyward_iac.infra.programs.local_node import orphan_sandboxes, sandbox_dirs
from skyward_iac.infra.stacks import home, leases
from skyward_iac.infra.stacks.leases import LEASE_UNTIL
from skyward_iac.infra.stacks.planned import expired_plan_reason
from skyward_iac.infra.stacks.tags import (
    WARM_UNTIL,
    ProcessId,
    StackRecord,
    boot_id,
    process_started,
)
from skyward_iac.processes import is_alive, stop_sandbox

log = logging.getLogger("skyward")

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


def collect_reason(record: StackRecord, look: Look) -> str | None:
    """Why ``record`` should be destroyed now, or None to leave it alone."""
    tags = record.tags
    if record.resource_count == 0 or "created_at" not in tags:
        return None
    owner, state = tags.get("owner", "?"), owner_state(record, look)
    warm = tags.get(WARM_UNTIL)
    if warm and not wall_passed(warm, look.now, same_clock=state != ELSEWHERE):
        return None  # a keeper keeps it for the next equal pool (it destroys it itself)
    if state == RUNNING:
        return None
    expires = tags.get("expires_at", "never")
    if state == DEAD:
        if tags.get(LEASE_UNTIL):  # a pool with a ttl whose owner was here and is gone
            return f"its owner ({owner}) was a process of this machine and is gone"
        if wall_passed(expires, look.now, same_clock=True):
            return f"expired at {expires} and its owner ({owner}) is gone"
        return None
    if tags.get(LEASE_UNTIL):
        why = lease_reason(record, look)
        return f"{why} (owner {owner})" if why else None
    if wall_passed(expires, look.now, same_clock=False):  # a stack from before leases
        return f"expired at {expires} and its owner ({owner}) is on another machine"
    return None


def prune_reason(record: StackRecord, now: datetime, retention: timedelta) -> str | None:
    """Why an empty stack's record should be removed (older than the history retention)."""
    created = record.tags.get("created_at")
    if record.resource_count or not created:
        return None
    if datetime.fromisoformat(created) + retention > now:
        return None
    return f"empty and created {created}, older than the retention of {retention.days} days"


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


@dataclass(frozen=True, slots=True)
class Action:
    """One thing gc did (or would do, with ``dry_run``)."""

    stack: str
    action: str  # destroyed, pruned, removed (a plan's stack), skipped, failed, reaped, repaired
    reason: str


def collect(retention_days: float | None = None, dry_run: bool = False,
            only: Iterable[str] | None = None, this_host_only: bool = False) -> list[Action]:
    """Destroy stale stacks and, unless ``retention_days`` is None, prune empty ones older
    than the retention. ``this_host_only`` limits gc to stacks this machine created (the quick
    gc a new Compute runs). Returns what was done (or would be, with ``dry_run``)."""
    from skyward_iac.infra.stacks.stack import ClusterStack, list_records

    wanted = set(only) if only is not None else None
    actions: list[Action] = []
    if not dry_run:
        for pid in reap_orphans():
            actions.append(Action("-", "reaped", f"provider process {pid} had outlived its "
                                                 "engine"))
        directory = home.file_backend()
        for line in repair_state(directory) if directory else ():
            actions.append(Action("-", "repaired", line))
        # Sandboxes first, stacks second: a node's stack exists before its sandbox does, so a
        # pool being created right now is always among the stacks listed after.
        sandboxes = sandbox_dirs(home.local_nodes_dir())
        known = [record.name for record in list_records(only_live=False)]
        for sandbox in orphan_sandboxes(sandboxes, known, home.backend_url()):
            stop_sandbox(sandbox)
            actions.append(Action(sandbox.parent.name, "reaped",
                                  f"Local node sandbox {sandbox.name} had no stack"))
    records = list_records(only_live=retention_days is None)
    seen = look(records)
    for record in records:
        if wanted is not None and record.name not in wanted:
            continue
        if this_host_only and record.tags.get("host") != seen.host:
            continue
        if reason := collect_reason(record, seen):
            actions.append(Action(record.name, "destroyed", reason) if dry_run
                           else _destroy(ClusterStack, record.name, reason))
        elif reason := expired_plan_reason(record, seen.now, seen.host):
            if not dry_run:
                ClusterStack.select(record.name).remove()
            actions.append(Action(record.name, "removed", reason))
        elif retention_days is not None and (
            reason := prune_reason(record, seen.now, timedelta(days=retention_days))
        ):
            if not dry_run:
                ClusterStack.select(record.name).remove()
            actions.append(Action(record.name, "pruned", reason))
    return actions


def _destroy(stack_type: type, name: str, reason: str) -> Action:
    try:
        stack = stack_type.select(name)
        stack.clear_crash_leftovers()
        stack.destroy(message=f"skyward gc: {reason}")
    except StackBusyError:
        return Action(name, "skipped", "another update holds the stack (a collector or its owner)")
    except Exception as exc:  # noqa: BLE001 - one stack's failure must not stop the others
        return Action(name, "failed", str(exc).strip().splitlines()[-1] if str(exc) else repr(exc))
    return Action(name, "destroyed", reason)
