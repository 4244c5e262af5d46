"""``skyward-iac preview``: the resources and the cost of a pool, from a real ``pulumi preview``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from skyward_iac.cli_commands.spec_flags import (
    add_hardware_flags,
    check_hardware_flags,
    hardware_settings,
    positive,
    spec_from_args,
)
from skyward_iac.infra.stack_config import PROVIDERS


def add_parser(commands: Any) -> None:
    """Register ``preview`` on the root parser's sub-commands."""
    parser = commands.add_parser(
        "preview", help="what a pool would create and cost (pulumi preview; nothing is created)",
        description="Run a real `pulumi preview` of the stack sky.Compute would create for "
                    "these flags, then remove that stack again. Prints the planned resources "
                    "and the estimated cost from the offer catalog (Local costs 0).",
    )
    parser.add_argument("--provider", choices=PROVIDERS, required=True)
    parser.add_argument("--nodes", type=positive(int), default=1, help="nodes (default: 1)")
    add_hardware_flags(parser)
    parser.add_argument("--disk-gb", type=positive(int), help="root disk per node")
    parser.add_argument("--ttl", type=int, help="seconds a node outlives a silent client")
    parser.add_argument("--project", help="GCP project")
    parser.add_argument("--zone", help="GCP zone")
    parser.add_argument("--ssh-cidr", help="who may reach SSH (default: your public /32)")
    parser.add_argument("--hours", type=float, default=1.0,
                        help="estimate the cost of this many hours (default: 1)")
    parser.add_argument("--diff", action="store_true", help="also print the engine's diff")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run, parser=parser)


def run(args: argparse.Namespace) -> int:
    """Preview one pool; exit code 1 on a bad request, a missing engine or plugin."""
    from skyward_iac.orchestration.preview import preview

    check_hardware_flags(args.parser, args)
    if args.hours < 0:
        args.parser.error(f"--hours must be >= 0, got {args.hours:g}")
    cloud_only = {"project": args.project, "zone": args.zone, "sshCidr": args.ssh_cidr}
    if args.provider == "local" and (given := [k for k, v in cloud_only.items() if v]):
        args.parser.error(f"--provider local takes no {', '.join(given)}")
    settings = {**hardware_settings(args), "nodes": args.nodes, "diskGb": args.disk_gb,
                "ttl": args.ttl}
    if args.provider == "gcp":
        settings.update(project=args.project, zone=args.zone, sshCidr=args.ssh_cidr)
    elif args.provider == "aws":
        settings.update(sshCidr=args.ssh_cidr)
    result = preview(spec_from_args(args.provider, settings), hours=args.hours)
    if args.json:
        report = result.to_dict()
        if args.diff:
            report["diff"] = result.plan.text
        print(json.dumps(report, indent=2))
        return 0
    if args.diff:
        print(result.plan.text.rstrip() + "\n")
    print("offer: this machine (Local nodes cost nothing)" if args.provider == "local"
          else f"offer: {result.choice}")
    print(f"planned changes ({_counts(result.plan.changes)}):")
    for resource in result.plan.resources:
        print(f"  {resource.op:<8} {resource.type:<52} {resource.name}")
    print(f"estimated cost: ${result.hourly:.4f}/h, ${result.estimate:.2f} for {args.hours:g} h"
          + ("" if args.provider == "local" else
             " (estimated spot price: the shipped catalog's typical figure, not a quote; "
             "`skyward-iac offers refresh` fetches live prices)" if result.choice.estimated
             else " (catalog prices, not live quotes)"))
    return 0


def _counts(changes: dict[str, int]) -> str:
    return ", ".join(f"{count} to {op}" for op, count in sorted(changes.items())) or "none"
