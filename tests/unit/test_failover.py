"""Capacity failover: the order of places a new pool tries, and what counts as no capacity."""

from __future__ import annotations

import pytest

import skyward_iac as sky
from skyward_iac.infra import offers
from skyward_iac.infra.failover import alternatives, capacity_refused
from skyward_iac.infra.programs import ClusterRequest


def request_for(spec: sky.Spec, nodes: int = 2) -> ClusterRequest:
    return ClusterRequest("s", spec, nodes, offer=offers.select([spec]).offer)


def test_gcp_tries_the_other_zones_then_the_other_regions() -> None:
    request = request_for(sky.Spec(sky.GCP(), sky.accelerators.L4(), allocation="on-demand"))
    offer = request.offer
    assert offer is not None and len(offer.zones) > 1
    places = alternatives(request)
    zones = [a for a in places if a.request.offer == offer]
    assert [a.request.zone for a in zones] == list(offer.zones[1:])
    regions = [a.request.offer.region for a in places[len(zones):]]  # type: ignore[union-attr]
    assert regions and offer.region not in regions and len(set(regions)) == len(regions)
    assert all(a.request.offer.instance_type == offer.instance_type  # type: ignore[union-attr]
               for a in places)
    # cheapest listed price first
    prices = [a.request.offer.on_demand for a in places[len(zones):]]  # type: ignore[union-attr]
    assert prices == sorted(prices)


def test_aws_moves_between_regions_of_the_same_type() -> None:
    request = request_for(sky.Spec(sky.AWS(), sky.accelerators.A10G(), allocation="on-demand"))
    places = alternatives(request)
    assert [a.why for a in places] and all("next region" in a.why for a in places)
    assert {a.request.offer.region for a in places} == (  # type: ignore[union-attr]
        {o.region for o in offers.packaged_catalog("aws").offers
         if o.instance_type == request.offer.instance_type} - {request.offer.region})  # type: ignore[union-attr]


def test_a_pinned_region_or_zone_stays() -> None:
    pinned = request_for(sky.Spec(sky.GCP(zone="us-central1-b"), sky.accelerators.L4(),
                                  allocation="on-demand", region="us-central1"))
    assert alternatives(pinned) == []
    region_only = request_for(sky.Spec(sky.AWS(region="us-east-1"), sky.accelerators.A10G()))
    assert alternatives(region_only) == []


def test_local_has_nowhere_else() -> None:
    assert alternatives(request_for(sky.Spec(sky.Local()))) == []


@pytest.mark.parametrize(("message", "refused"), [
    ("InsufficientInstanceCapacity: We currently do not have sufficient g5.xlarge capacity", True),
    ("The zone 'us-central1-a' does not have enough resources available to fulfill the request",
     True),
    ("Error 403: Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region us-central1", True),
    ("VcpuLimitExceeded: You have requested more vCPU capacity than your current vCPU limit", True),
    ("UnauthorizedOperation: You are not authorized to perform this operation", False),
    ("InvalidParameterValue: invalid AMI", False),
])
def test_what_counts_as_no_capacity(message: str, refused: bool) -> None:
    assert capacity_refused(message) is refused


def test_up_with_failover_moves_until_a_place_has_capacity() -> None:
    from skyward_iac.api.errors import ProvisionError
    from skyward_iac.infra.failover import up_with_failover

    request = request_for(sky.Spec(sky.GCP(), sky.accelerators.L4(), allocation="on-demand"), 3)
    places = alternatives(request)
    tried: list[tuple[str, str | None]] = []
    moves: list[tuple[int, str]] = []

    def up(attempt: ClusterRequest) -> str:
        tried.append((attempt.offer.region, attempt.zone))  # type: ignore[union-attr]
        if len(tried) < 3:
            raise ProvisionError("error: ZONE_RESOURCE_POOL_EXHAUSTED: no L4 here")
        return "outputs"

    result, in_force = up_with_failover(up, request, places, limit=5,
                                        on_move=lambda r, p, n, why: moves.append((n, why)))
    assert result == "outputs" and in_force.node_count == 3
    assert len(tried) == 3 and len(set(tried)) == 3  # three different places
    assert [n for n, _ in moves] == [2, 3] and "ZONE_RESOURCE_POOL_EXHAUSTED" in moves[0][1]


def test_up_with_failover_gives_up_at_the_limit_and_on_other_errors() -> None:
    from skyward_iac.api.errors import ProvisionError
    from skyward_iac.infra.failover import up_with_failover

    request = request_for(sky.Spec(sky.GCP(), sky.accelerators.L4(), allocation="on-demand"))
    calls: list[ClusterRequest] = []

    def no_capacity(attempt: ClusterRequest) -> None:
        calls.append(attempt)
        raise ProvisionError("InsufficientInstanceCapacity")

    with pytest.raises(ProvisionError):
        up_with_failover(no_capacity, request, alternatives(request), limit=2,
                         on_move=lambda *_: None)
    assert len(calls) == 2

    def denied(attempt: ClusterRequest) -> None:
        calls.append(attempt)
        raise ProvisionError("UnauthorizedOperation")

    calls.clear()
    with pytest.raises(ProvisionError, match="Unauthorized"):
        up_with_failover(denied, request, alternatives(request), limit=5,
                         on_move=lambda *_: None)
    assert len(calls) == 1  # not a capacity problem: nowhere else would do better
