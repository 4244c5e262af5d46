"""``offers refresh`` on AWS against real protocol peers: moto's EC2 server (instance types,
offerings, spot price history) and a Price List API server (tests/pricing_servers.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from moto.server import ThreadedMotoServer

from skyward_iac.cli import main
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.pricing.aws import hourly_on_demand, lowest_current_spot, refresh_aws
from tests.pricing_servers import PriceListApi, json_server, price_list_product

MOTO_SPOT = 0.00001  # moto's spot price history quotes this for every type and zone
PRODUCTS = [
    price_list_product("t3.medium", "us-east-1", 0.0418),
    price_list_product("t3.medium", "us-east-1", 0.0520),  # a second page; the lower one wins
    price_list_product("t3.medium", "eu-west-1", 0.0456),
    price_list_product("g5.xlarge", "us-east-1", 1.006),
    price_list_product("m7g.xlarge", "us-east-1", 0.1632),
    price_list_product("g5.xlarge", "us-east-1", 0.5, operatingSystem="Windows"),
]


@pytest.fixture(scope="module")
def ec2_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def price_list() -> Iterator[tuple[PriceListApi, str]]:
    api = PriceListApi(PRODUCTS)
    with json_server(api) as url:
        yield api, url


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ec2_endpoint: str,
            price_list: tuple[PriceListApi, str]) -> PriceListApi:
    """Test credentials, both endpoints, and a skyward home of this test's own."""
    for name in list(os.environ):
        if name.startswith("AWS_") and name != "AWS_CA_BUNDLE":
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", ec2_endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_PRICING", price_list[1])
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    return price_list[0]


#: A row EC2 offers nowhere any more (P3 left the shipped catalog for that reason).
RETIRED = {"instance_type": "p3.2xlarge", "vcpus": 8, "memory_gb": 61, "architecture": "x86_64",
           "accelerator": {"name": "V100", "count": 1, "memory_gb": 16},
           "regions": {"us-east-1": {"on_demand": 3.06, "spot": 1.0098,
                                     "zones": ["us-east-1a"]}}}


def shipped(*types: str) -> dict[str, object]:
    data = offers.packaged_data("aws")
    rows = [r for r in [*data["instances"], RETIRED] if r["instance_type"] in types]
    return {**data, "instances": rows}


def moto_zones(region: str, instance_type: str) -> list[str]:
    """The zones moto's EC2 offers ``instance_type`` in (the shipped catalog lists the same)."""
    row = next(o for o in offers.packaged_catalog("aws").offers
               if o.instance_type == instance_type and o.region == region)
    return list(row.zones)


def test_refresh_prices_facts_and_spot_from_the_apis(aws_env: PriceListApi) -> None:
    result = refresh_aws(shipped("t3.medium", "g5.xlarge", "m7g.xlarge", "p3.2xlarge"),
                         ["us-east-1"])
    rows = {r["instance_type"]: r for r in result.data["instances"]}
    assert rows["t3.medium"]["regions"] == {"us-east-1": {
        "on_demand": 0.0418, "spot": MOTO_SPOT, "zones": moto_zones("us-east-1", "t3.medium")}}
    assert rows["g5.xlarge"]["regions"]["us-east-1"]["on_demand"] == 1.006  # not the Windows one
    g5 = rows["g5.xlarge"]
    assert (g5["vcpus"], g5["memory_gb"], g5["architecture"]) == (4, 16, "x86_64")
    # The GPU count is live; the name and nominal memory users match on stay as shipped.
    assert g5["accelerator"] == {"name": "A10G", "count": 1, "memory_gb": 24}
    assert rows["m7g.xlarge"]["architecture"] == "arm64"
    # p3 is retired: us-east-1 no longer offers it, so it has no price and is left out.
    assert "p3.2xlarge" not in rows and result.unpriced == ("p3.2xlarge us-east-1",)
    assert result.data["as_of"] > offers.packaged_catalog("aws").as_of
    # Every get_products call asked for exactly one Linux, shared-tenancy, unused-software price.
    sent = {f["Field"]: f["Value"] for f in aws_env.requests[0]["Filters"]}
    assert sent["operatingSystem"] == "Linux" and sent["tenancy"] == "Shared"
    assert sent["preInstalledSw"] == "NA" and sent["capacitystatus"] == "Used"
    assert any(r.get("NextToken") for r in aws_env.requests), "pagination was not followed"


def test_a_region_without_a_list_price_keeps_its_spot_price(aws_env: PriceListApi) -> None:
    result = refresh_aws(shipped("m7i.large"), ["us-east-1"])
    assert result.data["instances"][0]["regions"]["us-east-1"] == {
        "on_demand": None, "spot": MOTO_SPOT, "zones": moto_zones("us-east-1", "m7i.large")}


def test_cli_refresh_writes_the_catalog_that_offers_then_uses(
    aws_env: PriceListApi, capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["offers", "refresh", "--provider", "aws", "--region", "us-east-1"]) == 0
    written = offers.refreshed_path("aws")
    printed = capsys.readouterr().out
    assert str(written) in printed
    data = json.loads(written.read_text())
    assert {region for row in data["instances"] for region in row["regions"]} == {"us-east-1"}
    # The zones are EC2's, read live (here moto's, which the shipped rows list too).
    assert all(entry["zones"] == moto_zones("us-east-1", row["instance_type"])
               for row in data["instances"] for entry in row["regions"].values())

    catalog = offers.current_catalog("aws")
    assert catalog.refreshed and catalog.origin == str(written)
    assert main(["offers", "--provider", "aws", "--on-demand", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["catalog_origin"] == {"aws": str(written)}
    cheapest = listed["offers"][0]
    assert (cheapest["instance_type"], cheapest["region"]) == ("t3.medium", "us-east-1")
    assert cheapest["hourly_usd"] == 0.0418  # the live list price, not the shipped 0.0416
    assert {o["region"] for o in listed["offers"]} == {"us-east-1"}
    assert main(["offers", "--provider", "aws"]) == 0
    assert f"(refreshed, {written})" in capsys.readouterr().out


def test_an_older_refresh_loses_to_the_shipped_catalog(aws_env: PriceListApi) -> None:
    stale = {**offers.packaged_data("aws"), "as_of": "2020-01-01T00:00:00Z"}
    offers.write_refreshed(stale)
    assert offers.current_catalog("aws").origin == offers.SHIPPED


def test_refresh_without_credentials_fails_and_writes_nothing(
    aws_env: PriceListApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert main(["offers", "refresh", "--provider", "aws"]) == 1
    assert "no AWS credentials found" in capsys.readouterr().err
    assert not offers.refreshed_path("aws").exists()
    assert aws_env.requests == []


def test_price_parsing_of_real_response_shapes() -> None:
    page = [json.dumps(price_list_product("g6.xlarge", "us-east-1", 0.8048))]
    assert hourly_on_demand(page) == pytest.approx(0.8048)
    from datetime import UTC, datetime

    old, new = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    history = [
        {"InstanceType": "g6.xlarge", "AvailabilityZone": "a", "SpotPrice": "0.10", "Timestamp": old},
        {"InstanceType": "g6.xlarge", "AvailabilityZone": "a", "SpotPrice": "0.30", "Timestamp": new},
        {"InstanceType": "g6.xlarge", "AvailabilityZone": "b", "SpotPrice": "0.20", "Timestamp": new},
    ]
    # Zone a's latest is 0.30 (its older 0.10 no longer applies); zone b's 0.20 is the lowest.
    assert lowest_current_spot(history) == {"g6.xlarge": 0.20}
