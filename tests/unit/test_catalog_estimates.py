"""Estimated spot prices are marked as such and never pick the region by themselves."""

from __future__ import annotations

import io

import skyward_iac as sky
from skyward_iac.infra.capacity import offers
from skyward_iac.observability.console_log import LogConsole
from skyward_iac.observability.events import ClusterRequested


def test_shipped_spot_prices_are_estimates_and_refreshed_ones_are_not() -> None:
    shipped = offers.packaged_catalog("aws")
    assert all(o.spot_estimated for o in shipped.offers if o.spot is not None)
    assert not any(o.spot_estimated for o in shipped.offers if o.spot is None)
    refreshed = offers.Catalog.from_dict({**offers.packaged_data("aws"), "spot_estimated": False},
                                         origin="/tmp/refreshed.json")
    assert not any(o.spot_estimated for o in refreshed.offers)


def test_an_estimate_never_picks_the_region() -> None:
    # Every us-west-2 spot figure in the shipped catalog is below us-east-1's, while their
    # on-demand prices are equal: the estimate alone must not move spot pools west.
    for accelerator in (sky.accelerators.A10G(), sky.accelerators.T4(), None):
        spot = offers.select([sky.Spec(sky.AWS(), accelerator, allocation="spot")])
        on_demand = offers.select([sky.Spec(sky.AWS(), accelerator, allocation="on-demand")])
        assert spot.estimated and spot.offer.region == on_demand.offer.region == "us-east-1"


def test_a_live_spot_price_does_pick_the_region() -> None:
    data = offers.packaged_data("aws")
    live = offers.Catalog.from_dict({**data, "spot_estimated": False}, origin="/tmp/live.json")
    choice = offers.select([sky.Spec(sky.AWS(), sky.accelerators.A10G(), allocation="spot")],
                           catalogs={"aws": live})
    assert not choice.estimated and choice.offer.region == "us-west-2"  # really cheaper there


def test_estimated_prices_say_so_wherever_they_are_shown() -> None:
    choice = offers.select([sky.Spec(sky.AWS(), sky.accelerators.A10G(), allocation="spot")])
    assert "(est.)" in str(choice)
    on_demand = offers.select([sky.Spec(sky.AWS(), sky.accelerators.A10G(),
                                        allocation="on-demand")])
    assert "(est.)" not in str(on_demand)
    line = LogConsole(io.StringIO()).describe(
        ClusterRequested(stack="s", provider="aws", nodes=1, market="spot", hourly_usd=0.42,
                         estimated=True), None)
    assert line is not None and line.endswith("$0.42/h (est.)")
