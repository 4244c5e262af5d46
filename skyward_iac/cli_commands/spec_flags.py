"""Command-line flags that describe a pool, turned into a ``Spec`` like a stack's config is."""

from __future__ import annotations

import argparse
from typing import Any

from skyward_iac.api.spec import Spec
from skyward_iac.infra.stacks.config import spec_from_settings

ALLOCATIONS = ("spot-if-available", "spot", "on-demand", "cheapest")


def positive(kind: type[int | float]) -> Any:
    """An argparse type: a number > 0 (a bad value is a usage error, exit code 2)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def add_hardware_flags(parser: argparse.ArgumentParser) -> None:
    """What each node needs: accelerator, vCPUs, memory, region, price cap and market."""
    parser.add_argument("--accelerator", metavar="NAME",
                        help="accelerator per node, e.g. L4, A100, H100 (case-insensitive)")
    parser.add_argument("--count", type=positive(float), metavar="N",
                        help="accelerators per node (at least; needs --accelerator)")
    parser.add_argument("--accelerator-memory", metavar="GB",
                        help="accelerator memory, e.g. 40GB (A100 has 80GB and 40GB parts)")
    parser.add_argument("--vcpus", type=positive(float), help="at least this many vCPUs")
    parser.add_argument("--memory-gb", type=positive(float), help="at least this much RAM")
    parser.add_argument("--architecture", choices=("x86_64", "arm64"))
    parser.add_argument("--region", help="only this region")
    parser.add_argument("--max-hourly-cost", type=positive(float), metavar="USD",
                        help="at most this USD per node-hour")
    market = parser.add_mutually_exclusive_group()
    market.add_argument("--spot", dest="allocation", action="store_const", const="spot",
                        help="spot capacity only")
    market.add_argument("--on-demand", dest="allocation", action="store_const",
                        const="on-demand", help="on-demand capacity only")
    market.add_argument("--allocation", choices=ALLOCATIONS,
                        help="how nodes are bought (default: spot-if-available)")


def check_hardware_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Flags that make sense only together are usage errors (exit code 2) when alone."""
    for flag, value in (("--count", args.count), ("--accelerator-memory", args.accelerator_memory)):
        if value is not None and not args.accelerator:
            parser.error(f"{flag} needs --accelerator")


def hardware_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The hardware flags as stack-config settings (see ``infra/stacks/config.py``)."""
    return {
        "accelerator": args.accelerator, "acceleratorCount": args.count,
        "acceleratorMemory": args.accelerator_memory, "vcpus": args.vcpus,
        "memoryGb": args.memory_gb, "architecture": args.architecture, "region": args.region,
        "maxHourlyCost": args.max_hourly_cost, "allocation": args.allocation,
    }


def spec_from_args(provider: str, settings: dict[str, Any]) -> Spec:
    """A validated ``Spec``; raises ``ConfigError`` (exit code 1) when the values do not fit."""
    return spec_from_settings(provider, {k: v for k, v in settings.items() if v is not None})
