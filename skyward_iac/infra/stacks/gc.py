"""Garbage collection of stacks whose client is gone: the policy (pure) and its execution.

A stack is collected when it still holds resources and its owner is gone, judged without
comparing two machines' clocks (``api/deadlines.py``):

* the owner was a process of this machine (same host and boot) and neither it nor any holder
  recorded here (an adopter, a keeper: ``leases.hold``) runs: collected at once;
* another machine's stack: once its lease lapsed, as this machine sees it (unrenewed for a
  lease on this machine's monotonic clock, or, at a first look, ended more than
  ``MAX_CLOCK_SKEW`` ago).

A warm pool is left to its keeper until ``warm_until``, unless its keeper was a process of this
machine and is gone. The clusters of ``stacks/`` (run with
the pulumi CLI, no owner or lease) are listed as skipped, never collected. Stacks without a lease (``ttl=0``, or
from before leases) keep the older rule: expired, and the owner gone. Who the owner is and
whether its lease holds is ``owners.py``'s judgement, the one ``down`` and every other destroyer
use. Collection goes through the one destroy path (``destroy.py``): it clears what a crash
leaves (a stale lock, pending operations) with ``cancel`` and ``refresh``, destroys, and records
``gc: WHY`` as the reason; a stack its owner emptied after gc listed it (its process ended
after its own destroy) is skipped, its owner's record kept. Running two collectors at once is
safe: the second finds the stack locked and skips it. Empty stacks (pruned past the
retention, expired plans' stacks) are removed straight from a file or S3 backend without an
engine start (``engine/state_removal.py``), a locked one skipped; through the engine's ``stack
rm`` where that cannot be done.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from skyward_iac.api.deadlines import wall_passed
from skyward_iac.infra.engine import state_removal
from skyward_iac.infra.engine.provider_host import reap_orphans
from skyward_iac.infra.engine.state_repair import repair as repair_state
from skyward_iac.infra.programs.local_node import orphan_sandboxes, sandbox_dirs
from skyward_iac.infra.stacks import destroy, home
from skyward_iac.infra.stacks.leases import LEASE_UNTIL
from skyward_iac.infra.stacks.owners import (
    DEAD,
    ELSEWHERE,
    RUNNING,
    Look,
    lease_reason,
    look,
    owner_state,
)
from skyward_iac.infra.stacks.planned import expired_plan_reason
from skyward_iac.infra.stacks.records import PROJECT
from skyward_iac.infra.stacks.stack import ClusterStack, list_records
from skyward_iac.infra.stacks.tags import WARM_UNTIL, StackRecord
from skyward_iac.processes import stop_sandbox

log = logging.getLogger("skyward")
#: The Pulumi project of ``stacks/local`` (records.OPS_PROJECTS), whose nodes run here.
LOCAL_OPS_PROJECT = "skyward-local"


def collect_reason(record: StackRecord, look: Look) -> str | None:
    """Why ``record`` should be destroyed now, or None to leave it alone."""
    tags = record.tags
    if record.resource_count == 0 or "created_at" not in tags:
        return None
    owner, state = tags.get("owner", "?"), owner_state(record, look)
    warm = tags.get(WARM_UNTIL)
    # A keeper keeps it for the next equal pool (and destroys it itself); a keeper of this
    # machine that is gone (none of its holders runs) keeps nothing: its nodes stop by ttl.
    if warm and state != DEAD and not wall_passed(warm, look.now,
                                                  same_clock=state != ELSEWHERE):
        return None
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
        # A stacks/local cluster's nodes are named <project>-<stack> (skyward-local-dev);
        # its project is read only when such a sandbox exists (a pool's start runs this gc).
        if any(s.parent.name.startswith(f"{LOCAL_OPS_PROJECT}-") for s in sandboxes):
            known += [cluster.replace("/", "-") for cluster in ops_cluster_names()]
        for sandbox in orphan_sandboxes(sandboxes, known, home.backend_url()):
            stop_sandbox(sandbox)
            actions.append(Action(sandbox.parent.name, "reaped",
                                  f"Local node sandbox {sandbox.name} had no stack"))
    records = list_records(only_live=retention_days is None)
    seen = look(records)
    empties: list[Action] = []  # empty stacks to remove: all at once, after the loop
    for record in records:
        if wanted is not None and record.name not in wanted:
            continue
        if this_host_only and record.tags.get("host") != seen.host:
            continue
        if reason := collect_reason(record, seen):
            actions.append(Action(record.name, "destroyed", reason) if dry_run
                           else _destroy(record, seen, reason))
        elif reason := expired_plan_reason(record, seen.now, seen.host):
            empties.append(Action(record.name, "removed", reason))
        elif retention_days is not None and (
            reason := prune_reason(record, seen.now, timedelta(days=retention_days))
        ):
            empties.append(Action(record.name, "pruned", reason))
    actions += empties if dry_run else remove_empty(empties)
    if not this_host_only:
        actions += ops_actions(wanted)
    return actions


def remove_empty(empties: list[Action]) -> list[Action]:
    """Remove the empty stacks of ``empties`` straight from the backend (no engine start,
    ``state_removal``); a locked one, or one holding resources again, is skipped; one the
    direct removal does not handle (another backend or layout, a request failing) goes
    through the engine's ``stack rm``."""
    outcomes = state_removal.remove_empty_stacks(home.backend_url(), PROJECT,
                                                 [a.stack for a in empties])
    done = []
    for action in empties:
        outcome = outcomes[action.stack]
        if outcome == state_removal.BUSY:
            done.append(Action(action.stack, "skipped", "locked: an update holds the stack"))
            continue
        if outcome == state_removal.NOT_EMPTY:
            done.append(Action(action.stack, "skipped", "it holds resources (or a pending "
                                                        "operation) again"))
            continue
        if outcome == state_removal.REMOVED:
            # What `stack rm` deletes beside the backend's objects: the stack's settings.
            (home.workspace_dir() / f"Pulumi.{action.stack}.yaml").unlink(missing_ok=True)
        else:
            ClusterStack.select(action.stack).remove()
        done.append(action)
    return done


def ops_actions(wanted: set[str] | None = None) -> list[Action]:
    """The clusters of ``stacks/`` that hold resources, each skipped with the reason: they
    are run with the pulumi CLI and have no owner or lease gc could judge."""
    from skyward_iac.infra.stacks.records import ops_clusters

    return [Action(s.name, "skipped", "a cluster of stacks/ run with the pulumi CLI: gc "
                   f"never collects it (`pulumi destroy` in stacks/{_directory(s.name)})")
            for s in ops_clusters() if s.resource_count and (wanted is None or s.name in wanted)]


def ops_cluster_names() -> list[str]:
    """Every cluster of ``stacks/`` in the backend, ``PROJECT/STACK``."""
    from skyward_iac.infra.stacks.records import ops_clusters

    return [cluster.name for cluster in ops_clusters()]


def _directory(name: str) -> str:
    """``aws`` for ``skyward-aws/dev``."""
    return name.split("/", 1)[0].removeprefix("skyward-")


def _destroy(record: StackRecord, seen: Look, reason: str) -> Action:
    """Collect one stack through the one destroy path (``destroy.py``), as this run saw it."""
    outcome = destroy.destroy(record.name, destroy.Destroyer(destroy.GC, f"gc: {reason}"),
                              seen=(record, seen))
    if outcome.status == destroy.BUSY:
        return Action(record.name, "skipped",
                      "another update holds the stack (a collector or its owner)")
    if outcome.status == destroy.REFUSED:  # the one policy and gc's own rule disagree: leave it
        return Action(record.name, "skipped", outcome.detail)
    if outcome.status == destroy.FAILED:
        return Action(record.name, "failed", outcome.detail)
    if outcome.status == destroy.ALREADY_DOWN:  # emptied since it was listed, by its owner
        return Action(record.name, "skipped", "already down: destroyed since it was listed")
    return Action(record.name, "destroyed", reason)
