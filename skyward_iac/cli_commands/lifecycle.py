"""``skyward-iac gc`` and ``skyward-iac history``: cleaning up and auditing past runs
(``cli_commands/runs.py`` sums each run up)."""

from __future__ import annotations

import argparse
import json
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
    history = commands.add_parser(
        "history", help="past and live runs, newest first: who, what, where, how long, cost",
        description="Every recorded run of the backend in force (a shared one: the whole "
                    "team's), newest first: its actor, instance type, region, market, "
                    "node-hours and USD integrated over its resizes and fallbacks, and how it "
                    "ended. --json adds zones, nodes over time, every destroy tried and the "
                    "access log.")
    history.add_argument("--limit", type=int, default=50, help="the newest N runs (default 50)")
    history.add_argument("--json", action="store_true", help="machine-readable output")
    history.set_defaults(run=run_history, parser=history)


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


def run_history(args: argparse.Namespace) -> int:
    from skyward_iac.cli_commands.runs import all_runs, print_json

    if args.limit < 0:
        args.parser.error(f"--limit must be >= 0, got {args.limit}")
    runs = all_runs(args.limit, ops=True)
    if args.json:
        print_json(runs)
        return 0
    if not runs:
        print("no runs recorded")
        return 0
    print(f"{'CREATED':<25} {'STACK':<40} {'ACTOR':<24} {'WHERE':<32} {'NODE-H':>8} "
          f"{'USD':>9}  ENDED")
    for run in runs:
        where = " ".join(part for part in (run["instance_type"], run["region"], run["market"])
                         if part) or run["spec"]
        print(f"{run['created_at']:<25} {run['stack']:<40} {_short(run['actor'], 24):<24} "
              f"{_short(where, 32):<32} {run['node_hours']:>8.3f} {run['cost_usd']:>9.4f}  "
              f"{run['ended']}")
    return 0


def _short(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, marked with an ellipsis when cut."""
    return text if len(text) <= width else text[:width - 1] + "\u2026"
