"""Garbage collection of stacks whose client is gone: the policy (pure) and its execution.

A stack is collected when it still holds resources, its ``expires_at`` has passed and its
owner is gone: the owning process is dead on this host (pid and start time from its tags), or
the stack belongs to another host (whose nodes have stopped themselves by now). Collection
clears what a crash leaves (a stale lock, pending operations) with ``cancel`` and ``refresh``,
then destroys. Running two collectors at once is safe: the second finds the stack locked and
skips it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from skyward_iac.api.errors import StackBusyError
from skyward_iac.infra import home
from skyward_iac.infra.leases import lapsed
from skyward_iac.infra.local_node import orphan_sandboxes, sandbox_dirs
from skyward_iac.infra.provider_host import reap_orphans
from skyward_iac.infra.state_repair import repair as repair_state
from skyward_iac.infra.tags import StackRecord, process_started
from skyward_iac.processes import is_alive, stop_sandbox

log = logging.getLogger("skyward")


def owner_gone(tags: dict[str, str], host: str,
               alive: Callable[[int, str], bool]) -> bool:
    """True when the client that owns the stack no longer runs."""
    if tags.get("host") != host:
        return True  # another machine: its nodes' watchdogs are the guarantee
    try:
        pid = int(tags["pid"])
    except (KeyError, ValueError):
        return True
    return not alive(pid, tags.get("pid_started", ""))


def collect_reason(record: StackRecord, now: datetime, host: str,
                   alive: Callable[[int, str], bool]) -> str | None:
    """Why ``record`` should be destroyed now, or None to leave it alone."""
    if record.resource_count == 0 or "created_at" not in record.tags:
        return None
    expires = record.tags.get("expires_at", "never")
    if expires == "never" or datetime.fromisoformat(expires) > now:
        return None
    warm_until = record.tags.get("warm_until")
    if warm_until and datetime.fromisoformat(warm_until) > now:
        return None  # a keeper keeps it for the next equal pool (it destroys it itself)
    owner = record.tags.get("owner", "?")
    lease = lapsed(record.tags, now)
    if lease is True:  # from any machine: nobody renewed it
        return f"its lease lapsed at {record.tags['lease_until']} (owner {owner})"
    same_host_dead = record.tags.get("host") == host and owner_gone(record.tags, host, alive)
    if lease is False:
        # A live lease: only this machine, which can see its owner is dead, may collect early.
        return f"expired at {expires} and its owner ({owner}) is gone" if same_host_dead \
            else None
    if not owner_gone(record.tags, host, alive):  # a stack from before leases
        return None
    return f"expired at {expires} and its owner ({owner}) is gone"


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


@dataclass(frozen=True, slots=True)
class Action:
    """One thing gc did (or would do, with ``dry_run``)."""

    stack: str
    action: str  # "destroyed" | "pruned" | "skipped" | "failed" | "reaped" | "repaired"
    reason: str


def collect(retention_days: float | None = None, dry_run: bool = False,
            only: Iterable[str] | None = None, this_host_only: bool = False) -> list[Action]:
    """Destroy stale stacks and, unless ``retention_days`` is None, prune empty ones older
    than the retention. ``this_host_only`` limits gc to stacks this machine created (the quick
    gc a new Compute runs). Returns what was done (or would be, with ``dry_run``)."""
    from skyward_iac.infra.stack import ClusterStack, list_records

    now, host = datetime.now(UTC), socket.gethostname()
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
    for record in list_records(only_live=retention_days is None):
        if wanted is not None and record.name not in wanted:
            continue
        if this_host_only and record.tags.get("host") != host:
            continue
        if reason := collect_reason(record, now, host, pid_alive):
            actions.append(Action(record.name, "destroyed", reason) if dry_run
                           else _destroy(ClusterStack, record.name, reason))
        elif retention_days is not None and (
            reason := prune_reason(record, now, timedelta(days=retention_days))
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
