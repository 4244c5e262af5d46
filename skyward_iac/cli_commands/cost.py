"""``skyward-iac cost``: node-hours and USD by user, tag, instance type or month, from the
backend's records: on a shared backend, the whole team's runs.

Each run counts once, in the group of its actor (the authenticated cloud identity, else its
owner), its instance type, its creation month (UTC), or the value of one of its tags, with the
node-hours and USD integrated over its resizes and fallbacks (``runs.summary``). A run lies in
``--since``/``--until`` by its creation time; a live run counts what it used so far.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

#: What ``--by`` groups by; ``tag:KEY`` groups by one tag's value.
GROUPS = ("user", "tag", "instance_type", "month", "provider")
NONE = "(none)"


@dataclass(frozen=True, slots=True)
class Row:
    """One group of the report."""

    group: str
    runs: int
    node_hours: float
    cost_usd: float


def parse_time(text: str, flag: str) -> datetime:
    """``2026-11``, ``2026-11-22`` or an ISO time (UTC unless it says) for ``flag``."""
    for form in ("%Y-%m", "%Y-%m-%d"):
        try:
            return datetime.strptime(text, form).replace(tzinfo=UTC)
        except ValueError:
            pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{flag} {text!r}: give a month (2026-11), a day (2026-11-22) or an ISO time "
            "(2026-11-22T10:00:00+00:00)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def keys_of(run: Mapping[str, Any], by: str) -> list[str]:
    """The groups ``run`` counts in for ``--by``: one, or one per tag for plain ``tag``."""
    if by == "user":
        return [run.get("actor") or run.get("owner") or NONE]
    if by == "instance_type":
        return [run.get("instance_type") or NONE]
    if by == "provider":
        return [run.get("provider") or NONE]
    if by == "month":
        return [(run.get("created_at") or "")[:7] or NONE]
    tags: Mapping[str, str] = run.get("tags") or {}
    if by == "tag":
        return [f"{key}={value}" for key, value in sorted(tags.items())] or [NONE]
    return [tags.get(by.removeprefix("tag:")) or NONE]


def report(runs: Iterable[Mapping[str, Any]], by: str, since: datetime | None = None,
           until: datetime | None = None) -> list[Row]:
    """The runs created in ``[since, until)`` summed per group, costliest first."""
    sums: dict[str, list[float]] = {}
    for run in runs:
        if not within(run, since, until):
            continue
        for key in keys_of(run, by):
            entry = sums.setdefault(key, [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += float(run.get("node_hours") or 0)
            entry[2] += float(run.get("cost_usd") or 0)
    rows = [Row(key, int(n), round(hours, 4), round(usd, 4)) for key, (n, hours, usd)
            in sums.items()]
    return sorted(rows, key=lambda row: (-row.cost_usd, -row.node_hours, row.group))


def total(rows: Iterable[Row], runs: int) -> Row:
    """The report's total line (``runs``: distinct runs, which ``--by tag`` may count twice)."""
    rows = list(rows)
    return Row("total", runs, round(sum(r.node_hours for r in rows), 4),
               round(sum(r.cost_usd for r in rows), 4))


def add_parser(commands: Any) -> None:
    """Register ``cost`` on the CLI's sub-command parser."""
    cost = commands.add_parser(
        "cost", help="node-hours and USD by user, tag, instance type or month",
        description="Node-hours and USD of the runs in the backend in force (a shared one: the "
                    "whole team's), integrated over each run's resizes and fallbacks, grouped "
                    "by user (the authenticated cloud identity, else user@host), tag (tag:KEY "
                    "for one tag's values), instance type, provider or creation month (UTC). "
                    "A run counts in the window by its creation time.")
    cost.add_argument("--by", default="user", metavar="GROUP",
                      help=f"group by {', '.join(GROUPS)} or tag:KEY (default: user)")
    cost.add_argument("--since", type=lambda t: parse_time(t, "--since"), metavar="WHEN",
                      help="runs created at or after WHEN (2026-11, 2026-11-01, ISO time)")
    cost.add_argument("--until", type=lambda t: parse_time(t, "--until"), metavar="WHEN",
                      help="runs created before WHEN")
    form = cost.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="machine-readable output")
    form.add_argument("--csv", action="store_true", help="CSV with a header line")
    cost.set_defaults(run=run_cost, parser=cost)


def run_cost(args: argparse.Namespace) -> int:
    from skyward_iac.cli_commands.runs import all_runs, print_json

    if args.by not in GROUPS and not (args.by.startswith("tag:") and len(args.by) > 4):
        args.parser.error(f"--by {args.by!r}: one of {', '.join(GROUPS)} or tag:KEY")
    if args.since and args.until and args.since >= args.until:
        args.parser.error("--since must be before --until")
    runs = all_runs()
    rows = report(runs, args.by, args.since, args.until)
    counted = sum(1 for run in runs if within(run, args.since, args.until))
    summed = total(rows, counted)
    if args.json:
        print_json({"by": args.by, "since": _iso(args.since), "until": _iso(args.until),
                    "groups": [asdict(row) for row in rows], "total": asdict(summed)})
    elif args.csv:
        out = csv.writer(sys.stdout)
        out.writerow([args.by, "runs", "node_hours", "cost_usd"])
        for row in rows:
            out.writerow([row.group, row.runs, f"{row.node_hours:.4f}", f"{row.cost_usd:.4f}"])
    else:
        width = max([len(args.by), *(len(row.group) for row in rows), 5])
        print(f"{args.by.upper():<{width}} {'RUNS':>6} {'NODE-HOURS':>11} {'USD':>11}")
        for row in (*rows, summed):
            print(f"{row.group:<{width}} {row.runs:>6} {row.node_hours:>11.3f} "
                  f"{row.cost_usd:>11.4f}")
    return 0


def within(run: Mapping[str, Any], since: datetime | None, until: datetime | None) -> bool:
    """Whether ``run`` was created in ``[since, until)``."""
    if not run.get("created_at"):
        return False
    moment = datetime.fromisoformat(run["created_at"])
    return not ((since and moment < since) or (until and moment >= until))


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None
