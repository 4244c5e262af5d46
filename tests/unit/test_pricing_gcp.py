"""``offers refresh`` on GCP against a server speaking the Cloud Billing Catalog API's JSON
(SKU pages with ``nextPageToken``, Bearer or API-key authentication)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyward_iac.api.errors import ConfigError
from skyward_iac.cli import main
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.pricing.gcp import (
    ENDPOINT_ENV,
    GcpAuth,
    family_candidates,
    gcp_auth,
    index_skus,
    refresh_gcp,
)
from tests.pricing_servers import BillingCatalogApi, billing_sku, json_server

US = ["us-central1", "us-east1"]
SKUS = [
    billing_sku("N2 Instance Core running in Americas", "OnDemand", US, 0.031611),
    billing_sku("N2 Instance Ram running in Americas", "OnDemand", US, 0.004237, "GiBy.h"),
    billing_sku("Spot Preemptible N2 Instance Core running in Americas", "Preemptible", US, 0.0097),
    billing_sku("Spot Preemptible N2 Instance Ram running in Americas", "Preemptible", US, 0.0013,
                "GiBy.h"),
    billing_sku("G2 Instance Core running in Americas", "OnDemand", US, 0.024988),
    billing_sku("G2 Instance Ram running in Americas", "OnDemand", US, 0.002927, "GiBy.h"),
    billing_sku("Nvidia L4 GPU running in Americas", "OnDemand", US, 0.56),
    # No spot G2 RAM SKU: the G2 spot price cannot be built and stays null.
    billing_sku("Spot Preemptible G2 Instance Core running in Americas", "Preemptible", US, 0.01),
    billing_sku("Commitment v1: N2 Cpu in Americas for 1 Year", "Commit1Yr", US, 0.0199),
    billing_sku("N2 Custom Instance Core running in Americas", "OnDemand", US, 0.9),
    billing_sku("Nvidia Tesla A100 80GB GPU running in Americas", "OnDemand", US, 5.0),
    billing_sku("Nvidia Tesla A100 GPU running in Americas", "OnDemand", US, 2.9),
]


@pytest.fixture
def billing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[BillingCatalogApi]:
    api = BillingCatalogApi(SKUS)
    with json_server(api) as url:
        monkeypatch.setenv(ENDPOINT_ENV, url)
        monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
        yield api


def shipped(*types: str) -> dict[str, object]:
    data = offers.packaged_data("gcp")
    return {**data, "instances": [r for r in data["instances"] if r["instance_type"] in types]}


def test_prices_are_built_from_core_ram_and_gpu_skus(billing: BillingCatalogApi) -> None:
    auth = GcpAuth(("Authorization", "Bearer test-token"), "test")
    result = refresh_gcp(shipped("n2-standard-4", "g2-standard-4", "e2-standard-4"),
                         ["us-central1"], auth)
    rows = {r["instance_type"]: r for r in result.data["instances"]}
    n2 = rows["n2-standard-4"]["regions"]["us-central1"]
    assert n2["on_demand"] == pytest.approx(4 * 0.031611 + 16 * 0.004237)
    assert n2["spot"] == pytest.approx(4 * 0.0097 + 16 * 0.0013)
    shipped_n2 = shipped("n2-standard-4")["instances"][0]  # type: ignore[index]
    assert n2["zones"] == shipped_n2["regions"]["us-central1"]["zones"]
    g2 = rows["g2-standard-4"]["regions"]["us-central1"]
    assert g2["on_demand"] == pytest.approx(4 * 0.024988 + 16 * 0.002927 + 0.56)
    assert g2["spot"] is None
    # No E2 SKU was served: the type is left out and reported.
    assert result.unpriced == ("e2-standard-4 us-central1",)
    paths = [path for path, _ in billing.requests]
    assert len(paths) == len(SKUS) // billing.page_size, "every page must be fetched"
    assert all("currencyCode=USD" in path for path in paths)


def test_an_api_key_goes_in_a_header_not_the_url(billing: BillingCatalogApi) -> None:
    refresh_gcp(shipped("n2-standard-4"), ["us-east1"], GcpAuth(("x-goog-api-key", "test-key"),
                                                               "GOOGLE_API_KEY"))
    assert all("test-key" not in path for path, _ in billing.requests)


def test_refused_credentials_say_so_without_the_secret(billing: BillingCatalogApi) -> None:
    with pytest.raises(ConfigError, match="refused the request \\(401") as caught:
        refresh_gcp(shipped("n2-standard-4"), None, GcpAuth(("Authorization", "Bearer wrong"),
                                                            "GOOGLE_OAUTH_ACCESS_TOKEN"))
    assert "wrong" not in str(caught.value) and "invalid authentication" in str(caught.value)


def test_sku_families_match_machine_types() -> None:
    assert family_candidates("a2-ultragpu-1g") == ["a2 ultra", "a2"]
    assert family_candidates("n1-standard-8") == ["n1 standard", "n1"]
    index = index_skus([billing_sku("N1 Predefined Instance Core running in Americas",
                                    "OnDemand", ["us-east1"], 0.0316),
                        billing_sku("Spot Preemptible T2A Arm Instance Ram running in Americas",
                                    "Preemptible", ["us-central1"], 0.0010)])
    assert index == {("n1", "core", "on_demand", "us-east1"): 0.0316,
                     ("t2a", "ram", "spot", "us-central1"): 0.0010}


def test_cli_refresh_writes_the_gcp_catalog(billing: BillingCatalogApi,
                                           monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GOOGLE_OAUTH_ACCESS_TOKEN", billing.token)
    assert main(["offers", "refresh", "--provider", "gcp"]) == 0
    assert str(offers.refreshed_path("gcp")) in capsys.readouterr().out
    data = json.loads(offers.refreshed_path("gcp").read_text())
    assert {r["instance_type"] for r in data["instances"]} == {
        "n2-standard-4", "n2-standard-8", "g2-standard-4", "g2-standard-8", "g2-standard-48"}
    assert offers.current_catalog("gcp").refreshed


def test_no_gcp_credentials_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("GOOGLE_OAUTH_ACCESS_TOKEN", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcloud either
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    with pytest.raises(ConfigError, match="GOOGLE_OAUTH_ACCESS_TOKEN"):
        gcp_auth()
    assert main(["offers", "refresh", "--provider", "gcp"]) == 1
    assert "no GCP credentials" in capsys.readouterr().err
    assert not offers.refreshed_path("gcp").exists()
