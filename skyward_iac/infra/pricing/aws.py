"""Live AWS figures: on-demand prices from the Price List API, spot prices from the EC2 spot
price history, and instance facts (vCPUs, memory, GPUs, architecture) from EC2 itself.

Every call goes through boto3, so endpoints, credentials and retries follow the usual AWS
configuration (``AWS_PROFILE``, ``AWS_ENDPOINT_URL_EC2`` / ``AWS_ENDPOINT_URL_PRICING`` ...).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from skyward_iac.infra.pricing.document import Prices, RefreshedCatalog, build, regions_to_price

#: The Price List API answers only in a few regions; us-east-1 serves every region's prices.
PRICING_REGION = "us-east-1"
SOURCE = ("live: AWS Price List API (get_products, Linux, shared tenancy, no pre-installed "
          "software) for on-demand, EC2 spot price history (lowest current price across the "
          "region's zones) for spot, EC2 describe_instance_types for vCPUs, memory and GPUs, "
          "EC2 describe_instance_type_offerings (per availability zone) for the zones")
_BATCH = 100  # describe_instance_types takes at most 100 names


def on_demand_filters(instance_type: str, region: str) -> list[dict[str, str]]:
    """The ``get_products`` filters selecting one type's Linux on-demand price in ``region``."""
    fields = {"instanceType": instance_type, "regionCode": region, "operatingSystem": "Linux",
              "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used",
              "operation": "RunInstances"}
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in fields.items()]


def hourly_on_demand(price_list: Iterable[str]) -> float | None:
    """The hourly USD price in a ``get_products`` page (its PriceList JSON strings)."""
    found = []
    for product in map(json.loads, price_list):
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = float(dimension.get("pricePerUnit", {}).get("USD", 0))
                if dimension.get("unit") == "Hrs" and usd > 0:
                    found.append(usd)
    return min(found) if found else None


def lowest_current_spot(history: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Per instance type, the lowest of each zone's latest spot price."""
    latest: dict[tuple[str, str], tuple[datetime, float]] = {}
    for entry in history:
        key = (entry["InstanceType"], entry["AvailabilityZone"])
        stamp, price = entry["Timestamp"], float(entry["SpotPrice"])
        if key not in latest or stamp > latest[key][0]:
            latest[key] = (stamp, price)
    lowest: dict[str, float] = {}
    for (instance_type, _), (_, price) in latest.items():
        lowest[instance_type] = min(price, lowest.get(instance_type, price))
    return lowest


def instance_facts(described: dict[str, Any]) -> dict[str, Any]:
    """Catalog fields from one ``describe_instance_types`` entry. Accelerator names and
    memory stay as the shipped catalog has them (users match on the nominal "24GB")."""
    facts: dict[str, Any] = {
        "vcpus": described["VCpuInfo"]["DefaultVCpus"],
        "memory_gb": round(described["MemoryInfo"]["SizeInMiB"] / 1024, 2),
        "architecture": "arm64" if "arm64" in described["ProcessorInfo"]["SupportedArchitectures"]
        else "x86_64",
    }
    if gpus := described.get("GpuInfo", {}).get("Gpus"):
        facts["gpus"] = sum(gpu["Count"] for gpu in gpus)
    return facts


class AwsPrices:
    """Live prices and facts for a set of instance types, one boto3 session."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self._pricing = session.client("pricing", region_name=PRICING_REGION)
        self._spot: dict[str, dict[str, float]] = {}
        #: Region -> instance type -> the zones that offer it.
        self._offered: dict[str, dict[str, list[str]]] = {}
        self.facts: dict[str, dict[str, Any]] = {}

    def load(self, instance_types: Sequence[str], regions: Iterable[str]) -> None:
        """Fetch which zones of each region offer which types, their spot prices and facts."""
        for region in sorted(set(regions)):
            ec2 = self._session.client("ec2", region_name=region)
            offerings = ec2.get_paginator("describe_instance_type_offerings").paginate(
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": list(instance_types)}])
            zones: dict[str, set[str]] = {}
            for page in offerings:
                for offering in page["InstanceTypeOfferings"]:
                    zones.setdefault(offering["InstanceType"], set()).add(offering["Location"])
            self._offered[region] = {kind: sorted(found) for kind, found in zones.items()}
            offered = set(zones)
            if not offered:  # an empty InstanceTypes list would mean every type
                continue
            history = ec2.get_paginator("describe_spot_price_history").paginate(
                InstanceTypes=sorted(offered), ProductDescriptions=["Linux/UNIX"],
                StartTime=datetime.now(UTC))
            self._spot[region] = lowest_current_spot(
                entry for page in history for entry in page["SpotPriceHistory"])
            missing = sorted(offered - set(self.facts))
            for start in range(0, len(missing), _BATCH):
                described = ec2.describe_instance_types(InstanceTypes=missing[start:start + _BATCH])
                for entry in described["InstanceTypes"]:
                    self.facts[entry["InstanceType"]] = instance_facts(entry)

    def on_demand(self, instance_type: str, region: str) -> float | None:
        """The Linux on-demand USD/hour of ``instance_type`` in ``region``."""
        pages = self._pricing.get_paginator("get_products").paginate(
            ServiceCode="AmazonEC2", Filters=on_demand_filters(instance_type, region),
            FormatVersion="aws_v1")
        prices = [p for page in pages if (p := hourly_on_demand(page["PriceList"])) is not None]
        return min(prices) if prices else None

    def prices(self, row: dict[str, Any], region: str) -> Prices | None:
        """A catalog region entry for ``row`` (the zones that offer it, live); None when no
        zone of the region offers the type."""
        instance_type = row["instance_type"]
        zones = self._offered.get(region, {}).get(instance_type)
        if not zones:
            return None
        return {"on_demand": self.on_demand(instance_type, region),
                "spot": self._spot.get(region, {}).get(instance_type), "zones": zones}

    def row_facts(self, row: dict[str, Any]) -> dict[str, Any]:
        """The live facts to write over a shipped row (GPU count into its accelerator)."""
        facts = dict(self.facts.get(row["instance_type"], {}))
        gpus = facts.pop("gpus", None)
        if gpus and row.get("accelerator"):
            facts["accelerator"] = {**row["accelerator"], "count": gpus}
        return facts


def refresh_aws(shipped: dict[str, Any], regions: Sequence[str] | None = None,
                session: Any = None) -> RefreshedCatalog:
    """The shipped AWS catalog's instance types priced live in ``regions`` (default: the
    regions each type is listed in). Needs AWS credentials allowed ``pricing:GetProducts``,
    ``ec2:DescribeSpotPriceHistory``, ``ec2:DescribeInstanceTypes`` and
    ``ec2:DescribeInstanceTypeOfferings``."""
    import boto3  # type: ignore[import-untyped]

    source = AwsPrices(session or boto3.Session())
    wanted = {region for row in shipped["instances"] for region in regions_to_price(row, regions)}
    source.load([row["instance_type"] for row in shipped["instances"]], wanted)
    return build(shipped, regions, SOURCE, source.prices, source.row_facts)
