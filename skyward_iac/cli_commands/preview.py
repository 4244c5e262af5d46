"""``skyward-iac preview``: the resources and the cost of a pool, from a real ``pulumi preview``
(or, for an AWS or GCP pool where no real one can run, from its program declared offline)."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

from skyward_iac.api.providers import provider_class
from skyward_iac.cli_commands.paths import path_arg
from skyward_iac.cli_commands.spec_flags import (
    add_hardware_flags,
    check_hardware_flags,
    hardware_settings,
    positive,
    spec_from_args,
)
from skyward_iac.infra.stacks.config import PROVIDERS, known_keys
from skyward_iac.infra.stacks.planned import DEFAULT_PLAN_TTL


def add_parser(commands: Any) -> None:
    """Register ``preview`` and ``plan`` on the root parser's sub-commands."""
    parser = commands.add_parser(
        "preview", help="what a pool would create and cost (pulumi preview; nothing is created)",
        description="Run a real `pulumi preview` of the stack sky.Compute would create for "
                    "these flags, then remove that stack again. Prints the planned resources "
                    "and the estimated cost from the offer catalog (Local costs 0). An AWS or "
                    "GCP pool on a machine without the engine, the provider plugin or "
                    "credentials is declared offline: the stack's own program runs under "
                    "Pulumi mocks and every resource it declares is printed with its key "
                    "inputs, marked 'offline: no provider diff'.",
    )
    parser.add_argument("--provider", choices=PROVIDERS, required=True)
    _spec_flags(parser)
    parser.add_argument("--hours", type=float, default=1.0,
                        help="estimate the cost of this many hours (default: 1)")
    parser.add_argument("--diff", action="store_true", help="also print the engine's diff")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run, parser=parser)
    planner = commands.add_parser(
        "plan", help="create a pool's stack and save a reviewed plan of it (--out FILE)",
        description="Create the stack a pool would get, preview it with an update plan "
                    "(pulumi preview --save-plan) and write the plan file, sealed by the digest "
                    "it prints. `skyward-iac apply FILE --approved DIGEST` (or a pool started "
                    "with sky.Options(plan=FILE)) brings up exactly that stack, once (pulumi up "
                    "--plan); an edited file, or a pool that asks for anything else, is "
                    "refused. An unapplied plan expires after --plan-ttl. Where no real "
                    "preview can run (an AWS or GCP pool without the provider plugin or "
                    "credentials) it writes an offline plan: no stack, for review only, "
                    "refused by apply.")
    source = planner.add_mutually_exclusive_group(required=True)
    source.add_argument("--provider", choices=PROVIDERS)
    source.add_argument("--pool", metavar="NAME", help="a [pools.NAME] of skyward.toml")
    _spec_flags(planner)
    planner.add_argument("--out", required=True, metavar="FILE", type=path_arg,
                         help="where to write the plan")
    planner.add_argument("--plan-ttl", type=positive(float), default=DEFAULT_PLAN_TTL,
                         metavar="SECONDS",
                         help="how long the plan may wait for its apply; then it expires and "
                              f"gc removes its stack (default {DEFAULT_PLAN_TTL})")
    planner.add_argument("--max-lifetime", type=positive(int), metavar="SECONDS",
                         help="Options(max_lifetime) of the pool that will apply it")
    planner.add_argument("--max-cost-usd", type=positive(float), metavar="USD",
                         help="Options(max_cost_usd) of the pool that will apply it: the most "
                              "it may spend (the plan records it; an apply may ask for less)")
    planner.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                         help="Options(tags) of the pool that will apply it (repeatable)")
    planner.set_defaults(run=run_plan, parser=planner)
    applier = commands.add_parser(
        "apply", help="bring a reviewed plan's pool up and keep it warm for its user",
        description="Bring up the stack of a plan made by `skyward-iac plan` (pulumi up --plan), "
                    "bootstrap its nodes and leave them warm: the next sky.Compute with the same "
                    "spec adopts them in a fraction of a second. Unclaimed, they are destroyed "
                    "after --keep-warm. Refused before anything is created when the file's "
                    "digest is not --approved, the plan expired or was applied already.")
    applier.add_argument("plan", type=path_arg, help="the plan file")
    applier.add_argument("--approved", required=True, metavar="DIGEST",
                         help="the digest the reviewer approved (`skyward-iac plan` printed it)")
    applier.add_argument("--keep-warm", type=positive(float), default=900.0, metavar="SECONDS",
                         help="how long the pool waits for its user (default 900)")
    applier.add_argument("--max-cost-usd", type=positive(float), metavar="USD",
                         help="Options(max_cost_usd) of the applied pool, at most the plan's "
                              "(default: the plan's); the warm nodes stop themselves there")
    applier.set_defaults(run=run_apply, parser=applier)
    for declaring in (parser, planner):
        declaring.add_argument(
            "--offline", action="store_true",
            help="declare an aws or gcp pool offline even where a real preview could run (no "
                 "provider diff; an offline plan cannot be applied)")


def _spec_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=positive(int), default=1, help="nodes (default: 1)")
    add_hardware_flags(parser)
    parser.add_argument("--disk-gb", type=positive(int), help="root disk per node")
    parser.add_argument("--ttl", type=int, help="seconds a node outlives a silent client")
    parser.add_argument("--project", help="GCP project")
    parser.add_argument("--zone", help="GCP zone")
    parser.add_argument("--ssh-cidr", help="who may reach SSH (default: your public /32)")


def _spec(args: argparse.Namespace) -> Any:
    """The Spec the flags describe."""
    return spec_from_args(args.provider, _settings(args))


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The flags as stack-config settings (what ``spec_from_args`` and a plan's source hold)."""
    check_hardware_flags(args.parser, args)
    # Each provider's settings (infra/stacks/config.py) say which of these flags it takes.
    provider_only = {"project": args.project, "zone": args.zone, "sshCidr": args.ssh_cidr}
    takes = known_keys(args.provider)
    if given := [k for k, v in provider_only.items() if v and k not in takes]:
        args.parser.error(f"--provider {args.provider} takes no {', '.join(given)}")
    settings = {**hardware_settings(args), "nodes": args.nodes, "diskGb": args.disk_gb,
                "ttl": args.ttl, **provider_only}
    return {key: value for key, value in settings.items() if value is not None}


def run(args: argparse.Namespace) -> int:
    """Preview one pool; exit code 1 on a bad request or (Local) a missing engine."""
    from skyward_iac.orchestration.offline_preview import OfflinePreview
    from skyward_iac.orchestration.preview import preview

    if args.hours < 0:
        args.parser.error(f"--hours must be >= 0, got {args.hours:g}")
    result = preview(_spec(args), hours=args.hours, offline=args.offline or None)
    if isinstance(result, OfflinePreview):
        if args.json:
            print(json.dumps(result.to_dict(), indent=2))
        else:
            print_offline(result, args.diff)
        return 0
    if args.json:
        report = result.to_dict()
        if args.diff:
            report["diff"] = result.plan.text
        print(json.dumps(report, indent=2))
        return 0
    if args.diff:
        print(result.plan.text.rstrip() + "\n")
    local = provider_class(args.provider).on_this_machine  # no offer, no market price
    print("offer: this machine (Local nodes cost nothing)" if local
          else f"offer: {result.choice}")
    print(f"planned changes ({_counts(result.plan.changes)}):")
    for resource in result.plan.resources:
        print(f"  {resource.op:<8} {resource.type:<52} {resource.name}")
    print(f"estimated cost: ${result.hourly:.4f}/h, ${result.estimate:.2f} for {args.hours:g} h"
          + ("" if local else
             " (estimated spot price: the shipped catalog's typical figure, not a quote; "
             "`skyward-iac offers refresh` fetches live prices)" if result.choice.estimated
             else " (catalog prices, not live quotes)"))
    return 0


def run_plan(args: argparse.Namespace) -> int:
    """Create the pool's stack, preview it with an update plan, write the plan file."""
    from skyward_iac.api.options import Options
    from skyward_iac.orchestration.offline_preview import OfflinePlan
    from skyward_iac.orchestration.preview import save_reviewed_plan

    tags = dict(tag.partition("=")[::2] for tag in args.tag)
    if bad := [tag for tag in args.tag if "=" not in tag]:
        args.parser.error(f"--tag takes KEY=VALUE, got {bad[0]!r}")
    options = Options(max_lifetime=args.max_lifetime, tags=tags,
                      max_cost_usd=args.max_cost_usd)
    offline = args.offline or None
    if args.pool:
        saved = save_reviewed_plan((), args.pool, options, {}, args.out, {"pool": args.pool},
                                   args.plan_ttl, offline)
    else:
        settings = _settings(args)
        saved = save_reviewed_plan(
            (spec_from_args(args.provider, settings),), None, options, {}, args.out,
            {"provider": args.provider, "settings": settings}, args.plan_ttl, offline)
    if isinstance(saved, OfflinePlan):
        print_offline(saved.preview)
        print(f"\noffline plan written to {saved.path}\ndigest {saved.digest}\n"
              "It is for review and cannot be applied (no provider diff, no stack): `apply` "
              "refuses it. Make the plan to apply with this same `skyward-iac plan` where the "
              f"{saved.preview.declared.provider} provider plugin and credentials are.")
        return 0
    planned, reviewed = saved
    print(planned.text.rstrip() + "\n")
    print(f"stack {reviewed.stack}: planned changes ({_counts(planned.changes)}), "
          f"estimated ${reviewed.usd_per_hour:.4f}/h")
    print(f"plan written to {reviewed.path}, expires {reviewed.expires_at} unapplied")
    print(f"digest {reviewed.digest}")
    print(f"apply it, once, with: skyward-iac apply {shlex.quote(str(reviewed.path))} "
          f"--approved {reviewed.digest}")
    return 0


def run_apply(args: argparse.Namespace) -> int:
    """Bring a reviewed plan's pool up (pulumi up --plan, nodes bootstrapped) and leave it
    warm for ``--keep-warm`` seconds: the next equal ``sky.Compute`` adopts it."""
    from skyward_iac.api.errors import ConfigError
    from skyward_iac.api.options import Options
    from skyward_iac.orchestration.compute import Compute
    from skyward_iac.orchestration.reviewed import load

    # The seal first: an edited or unapproved file stops here, before anything is created.
    saved = load(args.plan, approved=args.approved)
    facts, source = saved.facts, saved.source
    budget = args.max_cost_usd if args.max_cost_usd is not None else facts.get("max_cost_usd")
    options = Options(plan=str(args.plan), keep_warm=args.keep_warm,
                      tags=facts.get("tags") or {}, max_lifetime=facts.get("max_lifetime"),
                      max_cost_usd=budget, console="log",
                      cluster=None if facts.get("collections", True) else False)
    if "pool" in source:
        compute = Compute(name=source["pool"], options=options)
    elif "provider" in source:
        compute = Compute(spec_from_args(source["provider"], source["settings"]),
                          options=options)
    else:
        raise ConfigError(f"{args.plan} does not say what pool it was made for; apply it "
                          "with sky.Compute(..., options=sky.Options(plan=...))")
    # The pool read the file again: it must be the very plan approved (not one swapped in).
    if getattr(compute.plan.reviewed, "digest", None) != saved.digest:
        raise ConfigError(f"{args.plan} changed while it was being applied; nothing was "
                          "created")
    with compute as pool:
        nodes = pool.current_nodes()
    print(f"{saved.stack}: {nodes} node(s) up under the reviewed plan {saved.digest}, kept "
          f"warm {args.keep_warm:g} s for the next equal sky.Compute (`skyward-iac ls` shows "
          "it)")
    return 0


def _counts(changes: dict[str, int]) -> str:
    return ", ".join(f"{count} to {op}" for op, count in sorted(changes.items())) or "none"


def print_offline(result: Any, diff: bool = False) -> None:
    """An ``OfflinePreview`` for a reviewer: every declared resource with its key inputs (a
    resource whose inputs equal an earlier one's of its type says so), the nodes, the catalog
    estimate, and why it is offline."""
    from skyward_iac.infra.capacity.offers import ESTIMATE
    from skyward_iac.orchestration.offline_preview import OFFLINE

    declared, choice = result.declared, result.choice
    print(f"{OFFLINE} (the {declared.provider} program declared under Pulumi mocks: nothing "
          "was created and no cloud was asked; why below)")
    if diff:
        print("--diff: offline there is no engine diff to print")
    print(f"offer: {choice}")
    print(f"resources the program declares ({len(declared.resources)}; 'at apply:' values "
          "are looked up when the stack is brought up):")
    seen: dict[tuple[str, str], str] = {}
    for resource in declared.resources:
        print(f"  {resource.type:<58} {resource.name}")
        if not resource.inputs:
            continue
        key = (resource.type, json.dumps(resource.inputs, sort_keys=True))
        if key in seen:
            print(f"      (inputs as {seen[key]})")
            continue
        seen[key] = resource.name
        for label, value in resource.inputs.items():
            shown = ", ".join(map(str, value)) if isinstance(value, list) else value
            print(f"      {label}: {shown}")
    decisions = declared.decisions
    print(f"nodes: {len(declared.nodes)} x {choice.offer.instance_type} {choice.market} in "
          f"{choice.offer.region}, zone {decisions.get('zone', '-')}")
    mark = ESTIMATE if choice.estimated else ""
    print(f"estimated cost: ${result.hourly:.4f}/h{mark}, ${result.estimate:.2f} for "
          f"{result.hours:g} h (catalog {result.catalog.describe()}; not live quotes)")
    if choice.estimated:
        print("(est.): a typical spot price, not a quote; `skyward-iac offers refresh` fetches "
              "live ones")
    print(f"{OFFLINE}: a real preview needs the engine, the provider plugin and credentials "
          f"here; missing: {result.reason}")
