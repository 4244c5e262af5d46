"""Every recorded run as the audit sees it (``skyward-iac history``, ``skyward-iac cost``): who,
what, where, how long, how much, how it ended and by whom.

Read from the backend's own records (``infra/stacks/records.py``: no engine start per run on a
file or S3 backend); ``summary`` is a pure function of one stack's tags, resource count and
update history.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from skyward_iac.infra.stacks import usage
from skyward_iac.infra.stacks.tags import (
    INSTANCE_TYPE,
    MARKET,
    REGION,
    USER_TAG,
    ZONES,
    actor_of,
)


def _utc(moment: datetime | None) -> datetime | None:
    return moment.replace(tzinfo=UTC) if moment is not None and moment.tzinfo is None else moment


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds") if moment.tzinfo \
        else moment.replace(tzinfo=UTC).isoformat(timespec="seconds")


def summary(name: str, tags: dict[str, str], resources: int, updates: Sequence[Any],
            now: datetime | None = None) -> dict[str, Any]:
    """One run as ``history`` shows it. ``updates``: the stack's update history, newest first
    (each with ``kind``, ``result``, ``message``, ``start_time``, ``end_time``).

    The run lasts from ``created_at`` (its owner's clock) to the end of its last destroy that
    succeeded (the destroyer's clock: the owner's when the pool ended itself), or until ``now``
    while it holds resources; node-hours and USD integrate its segments over that time."""
    from skyward_iac.infra.stacks import access

    now = now or datetime.now(UTC)
    started = datetime.fromisoformat(tags["created_at"]) if "created_at" in tags else None
    destroys = [u for u in updates if u.kind == "destroy"]
    done = next((u for u in destroys if u.result == "succeeded" and u.end_time), None)
    ended = _utc(done.end_time) if done is not None and not resources else None
    duration = max(((ended or now) - started).total_seconds(), 0.0) if started else None
    if started and not resources and done is None:
        # Holds nothing and was never destroyed: the plan of a pool never applied, or an apply
        # that failed before a node. It ran until its last update that succeeded, if any
        # (measured on the update's clock), not until now: it is billed nothing today.
        ups = [u.end_time.replace(tzinfo=u.end_time.tzinfo or UTC) for u in updates
               if u.kind == "update" and u.result == "succeeded" and u.end_time]
        duration = max((max(ups) - started).total_seconds(), 0.0) if ups else 0.0
    segments = usage.of_tags(tags)
    totals = usage.totals(segments, duration or 0.0)
    actor, source = actor_of(tags)
    hourly = float(tags.get("usd_per_hour", 0) or 0)
    return {
        "stack": name,
        "created_at": tags.get("created_at"),
        "owner": tags.get("owner"),
        "actor": actor,
        "actor_source": source,
        "provider": tags.get("provider"),
        "spec": f"{tags.get('provider', '?')} {tags.get('nodes', '?')}x "
                f"{tags.get('accelerator', 'cpu')} {tags.get('allocation', '')}".strip(),
        "instance_type": tags.get(INSTANCE_TYPE, ""),
        "region": tags.get(REGION, ""),
        "zones": [zone for zone in tags.get(ZONES, "").split(",") if zone],
        "market": tags.get(MARKET, ""),
        "nodes": int(tags.get("nodes", 0) or 0),
        "usd_per_hour": hourly,
        # Nodes over time: each resize or fallback, with when (the owner's clock) and the rate.
        "segments": [{"at": (started + timedelta(seconds=s.start_s)).isoformat(timespec="seconds")
                      if started else None, "after_s": round(s.start_s),
                      "nodes": s.nodes, "usd_per_hour": s.usd_per_hour,
                      **({"folded": True} if s.folded else {})} for s in segments],
        "duration_s": round(duration, 1) if duration is not None else None,
        "node_hours": round(totals.node_hours, 4),
        "cost_usd": round(totals.cost_usd, 4),
        # The older name of cost_usd, kept for scripts that read it.
        "estimated_usd": round(totals.cost_usd, 4),
        "tags": {k.removeprefix(USER_TAG): v for k, v in tags.items() if k.startswith(USER_TAG)},
        "live_resources": resources,
        "ended_at": ended.isoformat(timespec="seconds") if ended else None,
        "ended": (done.message or "destroyed") if done is not None and not resources else
                 ("running" if resources else "never provisioned"),
        "result": destroys[0].result if destroys else None,
        "ended_by": _ended_tag(tags),
        # Every destroy tried, newest first: a failed one stays on record beside the next.
        "destroys": [{"at": _iso(u.start_time), "result": u.result, "message": u.message}
                     for u in destroys],
        "taken_down_by": tags.get("down_by") or None,
        # Who reached its nodes with ssh, forward or cp, and when (newest first).
        "access": access.listing(tags),
        "managed_by": "skyward_iac",
    }


def ops_summaries(now: datetime) -> list[dict[str, Any]]:
    """``history``'s rows for the clusters of ``stacks/`` (``records.ops_clusters``): created
    at their first update, ended by their last destroy; no owner, rate or spec is recorded in
    the backend (their config is the ops team's), so their actor, node-hours and USD are not
    known here."""
    from skyward_iac.infra.stacks.records import ops_clusters

    rows = []
    for stack in ops_clusters(updates=True):
        first = min((u.start_time for u in stack.updates), default=None)
        if first is None:
            continue  # initialized, never run: nothing to audit yet
        directory = stack.name.split("/", 1)[0].removeprefix("skyward-")
        tags = {"created_at": _iso(first), "provider": directory}
        row = summary(stack.name, tags, stack.resource_count, stack.updates, now)
        rows.append({**row, "spec": f"stacks/{directory}", "actor_source": "",
                     "managed_by": f"pulumi CLI (stacks/{directory})"})
    return rows


def _ended_tag(tags: dict[str, str]) -> dict[str, str] | None:
    """The ``ended`` tag the destroy path writes (status, by, via, reason), if any."""
    try:
        fields = json.loads(tags.get("ended") or "null")
    except ValueError:
        return None
    return {str(k): str(v) for k, v in fields.items()} if isinstance(fields, dict) else None


def print_json(value: Any) -> None:
    """``value`` as JSON on stdout: indented for a person at a terminal, compact for a
    program (indenting costs a second per thousand runs: Python's encoder is slow at it)."""
    print(json.dumps(value, indent=2 if sys.stdout.isatty() else None))


def all_runs(limit: int | None = None, ops: bool = False) -> list[dict[str, Any]]:
    """Every recorded run (a stack with a ``created_at`` tag), newest first (the newest
    ``limit``); from the backend's records when readable directly, else through the engine
    (a few commands per run). ``ops``: the clusters of ``stacks/`` among them."""
    from skyward_iac.infra.stacks.records import list_records, stored_stacks
    from skyward_iac.infra.stacks.tags import skyward_tags

    decoded: dict[str, dict[str, str]] = {}

    def tags_of(stack: Any) -> dict[str, str]:  # decoded once per stack
        if stack.name not in decoded:
            decoded[stack.name] = skyward_tags(stack.tags)
        return decoded[stack.name]

    def newest(stacks: list[Any]) -> list[str]:  # only their histories are read
        dated = sorted(((tags_of(s).get("created_at", ""), s.name) for s in stacks),
                       reverse=True)
        return [name for created, name in dated if created][:limit]

    stored = stored_stacks(updates=True if limit is None else newest)
    found: list[tuple[str, dict[str, str], int, Sequence[Any] | None]]
    if stored is not None:
        found = [(s.name, tags_of(s), s.resource_count, s.updates) for s in stored]
    else:
        found = [(r.name, r.tags, r.resource_count, None) for r in list_records()]
    found = [run for run in found if "created_at" in run[1]]
    found.sort(key=lambda run: (run[1]["created_at"], run[0]), reverse=True)  # as newest()
    found = found[:limit] if limit is not None else found
    now = datetime.now(UTC)
    runs = [summary(name, tags, count, updates if updates is not None else _history(name), now)
            for name, tags, count, updates in found]
    if ops:
        runs = sorted(runs + ops_summaries(now), key=lambda run: (run["created_at"], run["stack"]),
                      reverse=True)[:limit]
    return runs


def _history(name: str) -> Sequence[Any]:
    """A stack's update history through the engine (a backend not readable directly)."""
    from skyward_iac.infra.stacks.stack import ClusterStack

    return ClusterStack.select(name).history()
