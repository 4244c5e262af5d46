"""Capacity failover: the order of places a new pool tries, and what counts as no capacity."""

from __future__ import annotations

from dataclasses import replace

import pytest

import skyward_iac as sky
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.capacity.failover import alternatives, capacity_refused
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
    from skyward_iac.infra.capacity.failover import up_with_failover

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
    from skyward_iac.infra.capacity.failover import up_with_failover

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


def test_a_multi_spec_pool_moves_to_the_next_spec_after_its_own_places() -> None:
    """AWS first (pinned region: no other region), then GCP: after the AWS places are
    exhausted the same stack declares the GCP Spec, at its own offer, on its own market."""
    from skyward_iac.api.errors import ProvisionError
    from skyward_iac.infra.capacity.failover import spec_alternatives, up_with_failover
    from skyward_iac.orchestration.plan import plan_pool

    aws = sky.Spec(sky.AWS(region="us-east-1", ssh_cidr="1.2.3.4/32"), sky.accelerators.L4(),
                   allocation="spot")
    gcp = sky.Spec(sky.GCP(project="p", ssh_cidr="1.2.3.4/32"), sky.accelerators.L4(),
                   allocation="on-demand")
    plan = plan_pool([aws, gcp], None, sky.Options(selection="first"), {})
    assert plan.spec.provider.kind == "aws"
    assert [c.spec.provider.kind for c in plan.fallbacks] == ["gcp"]
    request = replace(plan.request, on_demand_nodes=frozenset({0}))
    places = alternatives(request) + spec_alternatives(request, plan.fallbacks)
    assert places[-1].why.startswith("next Spec (gcp ")
    tried: list[ClusterRequest] = []

    def up(attempt: ClusterRequest) -> str:
        tried.append(attempt)
        if attempt.spec.provider.kind == "aws":
            raise ProvisionError("InsufficientInstanceCapacity: no g6 capacity")
        return "outputs"

    moved: list[ClusterRequest] = []
    _, in_force = up_with_failover(up, request, places, limit=10,
                                   on_move=lambda r, *_: moved.append(r))
    assert in_force.spec.provider.kind == "gcp" and in_force.offer.provider == "gcp"
    assert in_force.stack_name == plan.stack_name  # the same stack, now declaring GCP
    assert in_force.on_demand_nodes == frozenset() and in_force.market is None
    after = plan.moved_to(in_force)
    assert after.spec.provider.kind == "gcp" and after.choice.market == "on-demand"
    assert after.fallbacks == () and after.bounds == plan.bounds


def test_ranked_orders_specs_by_selection() -> None:
    cheap = sky.Spec(sky.GCP(project="p"), sky.accelerators.L4(), allocation="on-demand")
    dear = sky.Spec(sky.AWS(), sky.accelerators.L4(), nodes=4, allocation="on-demand")
    assert [c.spec for c in offers.ranked([dear, cheap], "cheapest")] == [cheap, dear]
    assert [c.spec for c in offers.ranked([dear, cheap], "first")] == [dear, cheap]
    assert offers.select([dear, cheap], "first").spec is dear


def test_fallbacks_keep_to_the_same_plugins_and_the_policy(tmp_path, monkeypatch) -> None:
    from skyward_iac.orchestration.plan import plan_pool

    aws = sky.Spec(sky.AWS(ssh_cidr="1.2.3.4/32"), sky.accelerators.L4())
    other_plugins = sky.Spec(sky.GCP(project="p", ssh_cidr="1.2.3.4/32"), sky.accelerators.L4(),
                             plugins=[sky.plugins.joblib()])
    plan = plan_pool([aws, other_plugins], None, sky.Options(selection="first"), {})
    assert plan.fallbacks == ()
    policy = tmp_path / "policy.toml"
    policy.write_text('allowed_providers = ["aws"]\n')
    monkeypatch.setenv("SKYWARD_POLICY", str(policy))
    gcp = sky.Spec(sky.GCP(project="p", ssh_cidr="1.2.3.4/32"), sky.accelerators.L4())
    assert plan_pool([aws, gcp], None, sky.Options(selection="first"), {}).fallbacks == ()
