"""``skyward-iac offers``: the catalog's offers that match a request, cheapest first;
``skyward-iac offers refresh``: rebuild the catalog from the live pricing APIs."""

from __future__ import annotations

import argparse
import json
from typing import Any

from skyward_iac.api.errors import ConfigError
from skyward_iac.cli_commands.spec_flags import (
    add_hardware_flags,
    check_hardware_flags,
    hardware_settings,
    positive,
    spec_from_args,
)
from skyward_iac.infra.capacity import offers


def add_parser(commands: Any) -> None:
    """Register ``offers`` on the root parser's sub-commands."""
    parser = commands.add_parser(
        "offers", help="instance types that match a request, sorted by price",
        description="List the offers of the catalog that serve a request, cheapest USD per "
                    "node-hour first. Prices are catalog figures (the shipped catalog, or the one "
                    "`offers refresh` wrote when it is newer), not live quotes.",
    )
    parser.add_argument("--provider", choices=offers.CLOUDS,
                        help="one cloud only (default: aws and gcp)")
    add_hardware_flags(parser)
    parser.add_argument("--limit", type=positive(int), metavar="N",
                        help="show only the N cheapest")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run, parser=parser)
    actions = parser.add_subparsers(dest="offers_action", metavar="ACTION")
    refresh = actions.add_parser(
        "refresh", help="rebuild the catalog from the live pricing APIs (needs credentials)",
        description="Price the catalog's instance types from the live APIs (AWS: Price List "
                    "and spot price history; GCP: Cloud Billing Catalog) and store the result in "
                    "$SKYWARD_HOME/catalog/<provider>.json; `offers` and pools use it while it "
                    "is newer than the shipped catalog.",
    )
    refresh.add_argument("--provider", choices=offers.CLOUDS,
                         help="one cloud only (default: aws and gcp)")
    refresh.add_argument("--region", action="append", metavar="REGION",
                         help="price in this region only (repeatable; default: the regions the "
                              "shipped catalog lists for each type)")
    refresh.set_defaults(run=run_refresh)


def run(args: argparse.Namespace) -> int:
    """List matching offers; exit code 1 when no provider has one."""
    check_hardware_flags(args.parser, args)
    providers = [args.provider] if args.provider else list(offers.CLOUDS)
    choices: list[offers.Choice] = []
    reasons: list[str] = []
    for provider in providers:
        spec = spec_from_args(provider, hardware_settings(args))
        try:
            choices.extend(offers.matching(spec))
        except ConfigError as exc:
            reasons.append(str(exc))
    if not choices:
        raise ConfigError("\n".join(reasons))
    choices.sort(key=lambda c: (c.hourly, c.offer.provider, c.offer.instance_type,
                                c.offer.region))
    shown = choices[: args.limit] if args.limit else choices
    catalogs = {p: offers.current_catalog(p) for p in providers}
    if args.json:
        print(json.dumps({
            "offers": [_row(c) for c in shown],
            "catalog_as_of": {p: c.as_of for p, c in catalogs.items()},
            "catalog_origin": {p: c.origin for p, c in catalogs.items()},
        }, indent=2))
        return 0
    print(f"{'PROVIDER':<8} {'INSTANCE TYPE':<22} {'REGION':<16} {'ACCELERATOR':<16} "
          f"{'VCPU':>5} {'MEM GB':>7} {'MARKET':<9} {'USD/H':>9}")
    for choice in shown:
        row = _row(choice)
        accel = (f"{row['accelerator_count']:g}x {row['accelerator']}" if row["accelerator"]
                 else "-")
        print(f"{row['provider']:<8} {row['instance_type']:<22} {row['region']:<16} "
              f"{accel:<16} {row['vcpus']:>5g} {row['memory_gb']:>7g} {row['market']:<9} "
              f"{row['hourly_usd']:>9.4f}{offers.ESTIMATE if row['estimated'] else ''}")
    more = f" (showing {len(shown)})" if len(shown) < len(choices) else ""
    used = "; ".join(c.describe() for c in catalogs.values())
    print(f"{len(choices)} offer(s){more}; catalog prices as of {used}; not live quotes")
    if any(c.estimated for c in shown):
        print("(est.): a typical spot price, not a quote; `skyward-iac offers refresh` fetches "
              "live ones")
    return 0


def run_refresh(args: argparse.Namespace) -> int:
    """Rebuild and store the catalogs; exit code 1 (nothing written) without credentials."""
    from skyward_iac.infra import pricing

    providers = [args.provider] if args.provider else list(offers.CLOUDS)
    for done in pricing.refresh(providers, args.region):
        data, skipped = done.catalog.data, done.catalog.unpriced
        print(f"{data['provider']}: {len(data['instances'])} instance type(s), "
              f"{done.catalog.prices} region price(s) as of {data['as_of']} -> {done.path}")
        if skipped:
            print(f"  without a live price (left out): {', '.join(skipped)}")
    return 0


def _row(choice: offers.Choice) -> dict[str, Any]:
    offer = choice.offer
    return {
        "provider": offer.provider, "instance_type": offer.instance_type,
        "region": offer.region, "accelerator": offer.accelerator,
        "accelerator_count": offer.accelerator_count,
        "accelerator_memory_gb": offer.accelerator_memory_gb, "vcpus": offer.vcpus,
        "memory_gb": offer.memory_gb, "architecture": offer.architecture,
        "market": choice.market, "hourly_usd": choice.hourly,
        "estimated": choice.estimated,
    }
