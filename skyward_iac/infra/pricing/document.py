"""The refreshed catalog document both clouds build: which rows to price and the result."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

Prices = dict[str, Any]  # {"on_demand": float | None, "spot": float | None, ...}


@dataclass(frozen=True, slots=True)
class RefreshedCatalog:
    """A catalog document rebuilt from live prices, and what could not be priced."""

    data: dict[str, Any]
    #: "<instance type> <region>" pairs with neither an on-demand nor a spot price; they are
    #: left out of the document (the type is not sold there, or the API has no figure).
    unpriced: tuple[str, ...]

    @property
    def prices(self) -> int:
        """How many (instance type, region) pairs carry a live price."""
        return sum(len(row["regions"]) for row in self.data["instances"])


def regions_to_price(row: dict[str, Any], regions: Sequence[str] | None) -> list[str]:
    """The regions to price ``row`` in: the requested ones, else those the shipped row lists."""
    return list(regions) if regions else list(row["regions"])


def build(shipped: dict[str, Any], regions: Sequence[str] | None, source: str,
          price: Callable[[dict[str, Any], str], Prices | None],
          facts: Callable[[dict[str, Any]], dict[str, Any]] = lambda row: {}) -> RefreshedCatalog:
    """Rebuild ``shipped`` (its instance types, names and accelerators) with live figures.

    ``price(row, region)`` returns the region's prices or None when there are none;
    ``facts(row)`` returns fields to overwrite (vCPUs, memory ...). Rows left without any
    region are dropped.
    """
    rows, unpriced = [], []
    for shipped_row in shipped["instances"]:
        row = {**copy.deepcopy(shipped_row), **facts(shipped_row), "regions": {}}
        for region in regions_to_price(shipped_row, regions):
            prices = price(shipped_row, region)
            if prices is None or (prices.get("on_demand") is None and prices.get("spot") is None):
                unpriced.append(f"{shipped_row['instance_type']} {region}")
                continue
            known_zones = shipped_row["regions"].get(region, {}).get("zones")
            row["regions"][region] = {**({"zones": known_zones} if known_zones else {}), **prices}
        if row["regions"]:
            rows.append(row)
    data = {
        "provider": shipped["provider"],
        "as_of": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "currency": "USD",
        "unit": shipped.get("unit", "per instance per hour"),
        "source": source,
        "notes": "Written by `skyward-iac offers refresh` from the live pricing APIs; spot "
                 "prices move hourly. Instance types and accelerator names come from the "
                 "shipped catalog, and so do zones unless the refresh read them live (AWS: "
                 "EC2's instance type offerings).",
        "instances": rows,
        "spot_estimated": False,  # live quotes
    }
    return RefreshedCatalog(data, tuple(unpriced))
