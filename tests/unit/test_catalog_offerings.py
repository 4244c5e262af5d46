"""The AWS catalog against EC2's offerings: every row can launch where it says, in the zones it
lists, and a type a region does not offer is a clear error.

EC2's answers come from moto (``DescribeInstanceTypeOfferings`` served from its dated snapshot
of the real API, moto 5.2.5): what only a real account can tell is whether the offerings have
changed since, and whether capacity is there.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import boto3  # type: ignore[import-untyped]
import pytest
from moto import mock_aws

import skyward_iac as sky
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.capacity.zones import unoffered, usable_zones

CATALOG = offers.packaged_catalog("aws")
REGIONS = sorted({o.region for o in CATALOG.offers})
TYPES = sorted({o.instance_type for o in CATALOG.offers})


@pytest.fixture(scope="module")
def offered() -> Iterator[dict[tuple[str, str], set[str]]]:
    """(region, instance type) -> the zones EC2 offers the type in, for the catalog's types."""
    with mock_aws():
        found: dict[tuple[str, str], set[str]] = {}
        for region in REGIONS:
            ec2: Any = boto3.client("ec2", region_name=region, aws_access_key_id="testing",
                                    aws_secret_access_key="testing")
            pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": TYPES}])
            for page in pages:
                for offering in page["InstanceTypeOfferings"]:
                    key = (region, offering["InstanceType"])
                    found.setdefault(key, set()).add(offering["Location"])
        yield found


@pytest.mark.parametrize("offer", CATALOG.offers, ids=lambda o: f"{o.instance_type}-{o.region}")
def test_every_row_lists_the_zones_ec2_offers_it_in(
        offer: offers.Offer, offered: dict[tuple[str, str], set[str]]) -> None:
    zones = offered.get((offer.region, offer.instance_type), set())
    assert zones, f"EC2 offers {offer.instance_type} in no zone of {offer.region}"
    assert list(offer.zones) == sorted(zones)


def test_the_rows_ec2_does_not_offer_are_gone() -> None:
    """P3 (V100) is offered in none of the catalog's regions, g6 not in eu-west-1."""
    assert not [o for o in CATALOG.offers if o.instance_type.startswith("p3.")]
    assert not [o for o in CATALOG.offers if o.instance_type.startswith("g6.")
                and o.region == "eu-west-1"]
    assert "p3.2xlarge" in str(offers.packaged_data("aws")["zones_source"])


def test_a_type_no_zone_of_its_region_offers_is_a_clear_error() -> None:
    g6 = next(o for o in CATALOG.offers if o.instance_type == "g6.xlarge")
    nowhere = replace(g6, region="eu-west-1", zones=())
    with pytest.raises(sky.ConfigError) as raised:
        usable_zones(nowhere)
    message = str(raised.value)
    assert "g6.xlarge" in message and "eu-west-1" in message
    assert "regions that offer it: us-east-1, us-west-2" in message
    assert str(unoffered(replace(nowhere, instance_type="p3.2xlarge"))).endswith(
        "no region of the catalog offers it")


def test_a_refreshed_row_without_zones_uses_the_shipped_ones() -> None:
    row = next(o for o in CATALOG.offers if o.instance_type == "g5.xlarge")
    assert usable_zones(replace(row, zones=())) == row.zones
