"""Offers: the shipped catalogs, filters, markets, selection across specs and the empty result."""

from __future__ import annotations

from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.api.accelerators import KNOWN
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.capacity.offers import Catalog, Offer, market_for

A = sky.accelerators


def spec(provider: Any = None, **fields: Any) -> sky.Spec:
    return sky.Spec(provider=provider or sky.AWS(), **fields)


def row(name: str, on_demand: float | None, spot: float | None, *, accelerator: str | None = None,
        count: int = 1, memory: float = 24, vcpus: int = 8, ram: int = 32,
        arch: str = "x86_64", region: str = "r1") -> dict[str, Any]:
    return {
        "instance_type": name, "vcpus": vcpus, "memory_gb": ram, "architecture": arch,
        "accelerator": {"name": accelerator, "count": count, "memory_gb": memory}
        if accelerator else None,
        "regions": {region: {"on_demand": on_demand, "spot": spot, "zones": [f"{region}-a"]}},
    }


def catalog(provider: str, *rows: dict[str, Any]) -> Catalog:
    return Catalog.from_dict({"provider": provider, "as_of": "2026-01", "source": "test",
                              "instances": list(rows)})


# -- the shipped catalogs ----------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_shipped_catalog_is_dated_sourced_and_consistent(provider: str) -> None:
    shipped = offers.packaged_catalog(provider)
    assert shipped.provider == provider and shipped.as_of and len(shipped.source) > 40
    assert len({o.instance_type for o in shipped.offers}) >= 15
    for offer in shipped.offers:
        where = f"{offer.instance_type} in {offer.region}"
        assert offer.on_demand is not None and offer.on_demand > 0, where
        assert offer.spot is None or 0 < offer.spot < offer.on_demand, where
        assert offer.vcpus > 0 and offer.memory_gb > 0, where
        assert offer.architecture in ("x86_64", "arm64"), where
        if offer.accelerator:
            # Factories must be able to ask for it: same name and a memory size they know.
            info = KNOWN[offer.accelerator]
            assert f"{offer.accelerator_memory_gb:g}GB" in info.memory, where
            assert offer.accelerator_count >= 1, where
        if provider == "gcp":
            assert offer.zones and all(z.startswith(offer.region + "-") for z in offer.zones)


@pytest.mark.parametrize("name", ["H100", "H200", "A100", "A10G", "L4", "L40S", "T4", "V100"])
def test_common_accelerators_have_offers(name: str) -> None:
    factory = getattr(A, name)
    providers = [p for p in (sky.AWS(), sky.GCP()) if _has_offer(spec(p, accelerator=factory()))]
    assert providers, f"no provider offers {name}"


def _has_offer(s: sky.Spec) -> bool:
    try:
        return bool(offers.matching(s))
    except sky.ConfigError:
        return False


# -- filters -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "check"), [
    ({"vcpus": 16}, lambda o: o.vcpus >= 16),
    ({"memory_gb": 60}, lambda o: o.memory_gb >= 60),
    ({"architecture": "arm64"}, lambda o: o.architecture == "arm64"),
    ({"region": "eu-west-1"}, lambda o: o.region == "eu-west-1"),
    ({"accelerator": A.A100(memory="40GB")},
     lambda o: o.accelerator == "A100" and o.accelerator_memory_gb == 40),
    ({"accelerator": A.A100()},
     lambda o: o.accelerator == "A100" and o.accelerator_memory_gb == 80),
    ({"accelerator": A.T4(count=4)}, lambda o: o.accelerator == "T4" and o.accelerator_count >= 4),
    ({}, lambda o: o.accelerator is None),  # CPU-only requests never get a GPU machine
])
def test_filters_keep_only_matching_offers(fields: dict[str, Any], check: Any) -> None:
    served = 0
    for provider in (sky.AWS(), sky.GCP()):
        try:
            choices = offers.matching(spec(provider, **fields))
        except sky.ConfigError:
            continue  # that provider has none; the other must
        served += 1
        assert choices and all(check(c.offer) for c in choices)
        everything = offers.packaged_catalog(provider.kind).offers
        assert len(choices) < len(everything)
    assert served


def test_matches_are_sorted_by_price_on_their_market() -> None:
    choices = offers.matching(spec(accelerator=A.L4(), allocation="on-demand"))
    prices = [c.hourly for c in choices]
    assert prices == sorted(prices) and all(c.market == "on-demand" for c in choices)
    assert all(c.hourly == c.offer.on_demand for c in choices)


@pytest.mark.parametrize(("allocation", "on_demand", "spot", "market"), [
    ("spot", 1.0, 0.3, "spot"), ("spot", 1.0, None, None),
    ("on-demand", 1.0, 0.3, "on-demand"), ("on-demand", None, 0.3, None),
    ("spot-if-available", 1.0, 0.3, "spot"), ("spot-if-available", 1.0, None, "on-demand"),
    ("cheapest", 1.0, 0.3, "spot"), ("cheapest", 1.0, 1.5, "on-demand"),
    ("cheapest", None, 0.3, "spot"),
])
def test_market_for_each_allocation(allocation: str, on_demand: float | None,
                                    spot: float | None, market: str | None) -> None:
    offer = Offer("aws", "x", "r1", 4, 16, "x86_64", on_demand, spot)
    assert market_for(allocation, offer) == market  # type: ignore[arg-type]


def test_max_hourly_cost_caps_the_price_paid() -> None:
    cat = catalog("aws", row("small", 1.0, 0.4), row("big", 3.0, 1.2), row("huge", 9.0, None))
    on_demand = offers.matching(spec(max_hourly_cost=2.0, allocation="on-demand"), cat)
    assert [c.offer.instance_type for c in on_demand] == ["small"]
    spot = offers.matching(spec(max_hourly_cost=2.0, allocation="spot"), cat)
    assert [c.offer.instance_type for c in spot] == ["small", "big"]
    with pytest.raises(sky.ConfigError, match=r"max_hourly_cost \$0.1 .*cheapest is \$0.4000/h"):
        offers.matching(spec(max_hourly_cost=0.1, allocation="spot"), cat)


def test_max_hourly_cost_on_the_real_catalog() -> None:
    for c in offers.matching(spec(accelerator=A.A10G(), max_hourly_cost=0.5)):
        assert c.hourly <= 0.5


# -- the empty result --------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "constraint", "hint"), [
    ({"accelerator": A.MI300X()}, "accelerator MI300X", "accelerators in the catalog:"),
    ({"accelerator": A.H100(memory="94GB")}, "accelerator memory 94GB", "memory sizes offered"),
    ({"accelerator": A.A10G(count=16)}, "at least 16 accelerator(s)", "counts per node offered"),
    ({"accelerator": A.T4(), "region": "ap-south-1"}, "region ap-south-1", "us-east-1"),
    ({"accelerator": A.A10G(), "architecture": "arm64"}, "architecture arm64", "x86_64"),
    ({"vcpus": 100_000}, "vcpus >= 100000", "the most is"),
    ({"memory_gb": 1e7}, "memory_gb >= 1e+07", "the most is"),
    ({"accelerator": A.B200(), "allocation": "spot"}, "allocation 'spot'", "on-demand"),
    ({"accelerator": A.H100(), "max_hourly_cost": 1}, "max_hourly_cost $1", "the cheapest is"),
])
def test_an_empty_result_names_the_constraint_that_emptied_it(
    fields: dict[str, Any], constraint: str, hint: str,
) -> None:
    with pytest.raises(sky.ConfigError) as error:
        offers.select([spec(**fields)])
    message = str(error.value)
    assert f"none with {constraint}" in message and hint in message
    assert message.startswith("no AWS offer matches")


def test_conflicting_regions_are_refused() -> None:
    with pytest.raises(sky.ConfigError, match="regions"):
        offers.matching(spec(sky.AWS(region="us-east-1"), region="eu-west-1"))
    with pytest.raises(sky.ConfigError, match="regions"):
        offers.matching(spec(sky.GCP(region="us-central1", zone="us-east1-b")))


# -- selection across specs --------------------------------------------------------------------

CATALOGS = {
    "aws": catalog("aws", row("aws.l4", 0.80, 0.35, accelerator="L4"),
                   row("aws.cpu", 0.20, 0.05)),
    "gcp": catalog("gcp", row("gcp.l4", 0.70, 0.28, accelerator="L4"),
                   row("gcp.l4x4", 4.00, 1.60, accelerator="L4", count=4)),
}


def test_cheapest_across_specs_picks_the_lowest_price() -> None:
    specs = [spec(sky.AWS(), accelerator=A.L4()), spec(sky.GCP(), accelerator=A.L4())]
    choice = offers.select(specs, "cheapest", CATALOGS)
    assert (choice.offer.instance_type, choice.market, choice.hourly) == ("gcp.l4", "spot", 0.28)
    on_demand = [s.model_copy(update={"allocation": "on-demand"}) for s in specs]
    assert offers.select(on_demand, "cheapest", CATALOGS).hourly == 0.70


def test_cheapest_compares_whole_clusters_not_nodes() -> None:
    specs = [spec(sky.GCP(), accelerator=A.L4(), nodes=2), spec(sky.AWS(), accelerator=A.L4())]
    choice = offers.select(specs, "cheapest", CATALOGS)
    assert choice.offer.instance_type == "aws.l4"  # 0.35 x 1 beats 0.28 x 2
    assert choice.cluster_hourly == pytest.approx(0.35)


def test_first_takes_the_first_spec_that_has_an_offer() -> None:
    specs = [spec(sky.AWS(), accelerator=A.H100()), spec(sky.AWS(), accelerator=A.L4()),
             spec(sky.GCP(), accelerator=A.L4())]
    choice = offers.select(specs, "first", CATALOGS)
    assert choice.offer.instance_type == "aws.l4" and choice.spec is specs[1]


def test_no_spec_matching_lists_every_reason() -> None:
    specs = [spec(sky.AWS(), accelerator=A.H100()), spec(sky.GCP(), accelerator=A.L4(),
                                                          max_hourly_cost=0.01)]
    with pytest.raises(sky.ConfigError) as error:
        offers.select(specs, "cheapest", CATALOGS)
    message = str(error.value)
    assert "spec 1 (aws)" in message and "accelerator H100" in message
    assert "spec 2 (gcp)" in message and "max_hourly_cost" in message


def test_local_is_free_and_wins_cheapest() -> None:
    specs = [spec(sky.AWS(), accelerator=A.L4()), spec(sky.Local())]
    choice = offers.select(specs, "cheapest", CATALOGS)
    assert choice.offer.provider == "local" and choice.hourly == 0


def test_estimate_scales_with_nodes_and_hours() -> None:
    choice = offers.select([spec(sky.GCP(), accelerator=A.L4(), nodes=3)], catalogs=CATALOGS)
    assert choice.estimate(hours=2) == pytest.approx(0.28 * 3 * 2)
    assert "gcp.l4" in str(choice) and "x 3" in str(choice)


def test_hourly_cost_prices_nodes_the_fallback_moved_on_demand() -> None:
    choice = offers.select([spec(sky.GCP(), accelerator=A.L4(), nodes=3)], catalogs=CATALOGS)
    assert choice.market == "spot"
    assert offers.hourly_cost(choice, 3) == pytest.approx(0.28 * 3)
    # node 1 went on demand (0.70); an index beyond the pool's size does not count
    assert offers.hourly_cost(choice, 3, {1, 7}) == pytest.approx(0.28 * 2 + 0.70)
    assert offers.hourly_cost(choice, 5) == pytest.approx(0.28 * 5)  # after a resize
