"""``skyward-iac gc`` and ``skyward-iac history``: cleaning up and auditing past runs."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any


def add_commands(commands: Any) -> None:
    """Register ``gc`` and ``history`` on the CLI's sub-command parser."""
    gc = commands.add_parser(
        "gc", help="destroy stacks whose owner is gone and whose expiry passed; prune old ones")
    gc.add_argument("--dry-run", action="store_true", help="say what would be done, do nothing")
    gc.add_argument("--retention-days", type=float, default=None,
                    help="also remove destroyed stacks' records older than this many days "
                         "(default: never; history is an audit record)")
    gc.add_argument("--json", action="store_true", help="machine-readable output")
    gc.set_defaults(run=run_gc)
    history = commands.add_parser("history", help="past and live runs, newest first")
    history.add_argument("--limit", type=int, default=50)
    history.add_argument("--json", action="store_true", help="machine-readable output")
    history.set_defaults(run=run_history)


def run_gc(args: argparse.Namespace) -> int:
    from skyward_iac.infra.stacks import gc

    actions = gc.collect(retention_days=args.retention_days, dry_run=args.dry_run)
    if args.json:
        print(json.dumps([{"stack": a.stack, "action": a.action, "reason": a.reason}
                          for a in actions], indent=2))
    elif not actions:
        print("nothing to collect")
    for a in actions if not args.json else ():
        verb = f"would be {a.action}" if args.dry_run else a.action
        print(f"{a.stack}: {verb} ({a.reason})")
    return 1 if any(a.action == "failed" for a in actions) else 0


def run_summary(name: str, tags: dict[str, str], resources: int,
                updates: Sequence[Any] | None = None) -> dict[str, Any]:
    """One run as ``history`` shows it: when, who, what, how long, cost, how it ended.

    ``updates``: the stack's update history, newest first (read through the CLI when None).
    """
    from skyward_iac.infra.stacks import access
    from skyward_iac.infra.stacks.stack import ClusterStack

    if updates is None:
        updates = ClusterStack.select(name).history()
    started = datetime.fromisoformat(tags["created_at"]) if "created_at" in tags else None
    destroy = next((u for u in updates if u.kind == "destroy"), None)
    ended = destroy.end_time if destroy and destroy.end_time else None
    if ended is not None and ended.tzinfo is None:
        ended = ended.replace(tzinfo=UTC)
    duration = ((ended or datetime.now(UTC)) - started).total_seconds() if started else None
    hourly = float(tags.get("usd_per_hour", 0) or 0)
    return {
        "stack": name,
        "created_at": tags.get("created_at"),
        "owner": tags.get("owner"),
        "spec": f"{tags.get('provider', '?')} {tags.get('nodes', '?')}x "
                f"{tags.get('accelerator', 'cpu')} {tags.get('allocation', '')}".strip(),
        "nodes": int(tags.get("nodes", 0) or 0),
        "duration_s": round(duration, 1) if duration is not None else None,
        "estimated_usd": round(hourly * (duration or 0) / 3600, 4),
        "live_resources": resources,
        "ended": (destroy.message or "destroyed") if destroy else
                 ("running" if resources else "never provisioned"),
        "result": destroy.result if destroy else None,
        # Who reached its nodes with ssh, forward or cp, and when (newest first).
        "access": access.listing(tags),
    }


def run_history_records(limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` runs as plain records; from the file backend's files when
    possible (no engine command per stack), else through the CLI."""
    from skyward_iac.infra.engine import state_files
    from skyward_iac.infra.stacks import home
    from skyward_iac.infra.stacks.stack import PROJECT, list_records
    from skyward_iac.infra.stacks.tags import skyward_tags

    directory = home.file_backend()
    stored = state_files.read_stacks(directory, PROJECT) if directory else None
    runs: list[tuple[str, dict[str, str], int, Sequence[Any] | None]]
    if stored is not None:
        runs = [(s.name, skyward_tags(s.tags), s.resource_count, s.updates) for s in stored]
    else:
        runs = [(r.name, r.tags, r.resource_count, None) for r in list_records()]
    runs = [run for run in runs if "created_at" in run[1]]
    runs.sort(key=lambda run: run[1]["created_at"], reverse=True)
    return [run_summary(*run) for run in runs[:limit]]


def run_history(args: argparse.Namespace) -> int:
    runs = run_history_records(args.limit)
    if args.json:
        print(json.dumps(runs, indent=2))
        return 0
    if not runs:
        print("no runs recorded")
    for run in runs:
        print(f"{run['created_at']}  {run['stack']:<44} {run['spec']:<28} "
              f"{run['duration_s'] or 0:>8.1f}s  ${run['estimated_usd']:<8} {run['ended']}")
    return 0
