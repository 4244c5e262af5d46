"""Capacity failover: the order of places a new pool tries, and how a refusal's scope spends
them (the classification itself: test_refusals.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

import skyward_iac as sky
from skyward_iac.api.errors import ProvisionError
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.capacity.failover import (
    alternatives,
    spec_alternatives,
    up_with_failover,
)
from skyward_iac.infra.capacity.zones import nodes_move_alone
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


def test_an_aws_placement_pool_tries_its_zones_then_the_regions() -> None:
    """A multi-node GPU pool (a cluster placement group lives in one zone) moves as a whole."""
    request = request_for(sky.Spec(sky.AWS(), sky.accelerators.A10G(), allocation="on-demand"))
    offer = request.offer
    assert offer is not None and len(offer.zones) > 1
    places = alternatives(request)
    zones = [a.request.zone for a in places if a.request.offer == offer]
    assert zones == list(offer.zones[1:])
    assert {a.request.offer.region for a in places[len(zones):]} == (  # type: ignore[union-attr]
        {o.region for o in offers.packaged_catalog("aws").offers
         if o.instance_type == offer.instance_type} - {offer.region})


def test_an_aws_pool_whose_nodes_move_alone_leaves_its_zones_to_the_node_fallback() -> None:
    request = request_for(sky.Spec(sky.AWS(), None, vcpus=4, allocation="on-demand"))
    assert nodes_move_alone(request)
    places = alternatives(request)
    assert places and all("next region" in a.why for a in places)


def test_a_pinned_region_or_zone_stays() -> None:
    pinned = request_for(sky.Spec(sky.GCP(zone="us-central1-b"), sky.accelerators.L4(),
                                  allocation="on-demand", region="us-central1"))
    assert alternatives(pinned) == []
    region_only = request_for(sky.Spec(sky.AWS(region="us-east-1"), sky.accelerators.A10G()))
    assert [a.request.offer.region for a in alternatives(region_only)] == [  # type: ignore[union-attr]
        "us-east-1"] * (len(region_only.offer.zones) - 1)  # type: ignore[union-attr]


def test_local_has_nowhere_else() -> None:
    assert alternatives(request_for(sky.Spec(sky.Local()))) == []


GCP_ZONE = "Error 503: ZONE_RESOURCE_POOL_EXHAUSTED: no L4 in us-central1-a"
GCP_REGION_QUOTA = ("Error 403: Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 0.0 in region "
                    "us-central1., quotaExceeded")
GCP_GLOBAL_QUOTA = "Error 403: Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally."


def gcp_l4(nodes: int = 2) -> ClusterRequest:
    return request_for(sky.Spec(sky.GCP(project="p"), sky.accelerators.L4(),
                                allocation="on-demand"), nodes)


def refusing(*errors: str) -> tuple[list[tuple[str, str | None, bool]],
                                     Callable[[ClusterRequest, bool], str]]:
    """An ``up`` that raises ``errors`` in turn, then succeeds; and the places it ran."""
    tried: list[tuple[str, str | None, bool]] = []

    def up(attempt: ClusterRequest, zone_next: bool) -> str:
        tried.append((attempt.offer.region, attempt.zone, zone_next))  # type: ignore[union-attr]
        if len(tried) <= len(errors):
            raise ProvisionError(f"pulumi up failed:\n  {errors[len(tried) - 1]}")
        return "outputs"

    return tried, up


def test_up_with_failover_moves_until_a_place_has_capacity() -> None:
    request = gcp_l4(3)
    moves: list[tuple[int, str]] = []
    tried, up = refusing(GCP_ZONE, GCP_ZONE)
    result, in_force = up_with_failover(up, request, alternatives(request), limit=5,
                                        on_move=lambda r, p, n, why: moves.append((n, why)))
    assert result == "outputs" and in_force.node_count == 3
    assert len(tried) == 3 and len({t[:2] for t in tried}) == 3  # three different places
    assert [n for n, _ in moves] == [2, 3] and "ZONE_RESOURCE_POOL_EXHAUSTED" in moves[0][1]
    # The node fallback is told when the next place is a sibling zone (it then leaves a
    # zone's refusal to the pool's move instead of going on demand).
    zones = len(request.offer.zones)  # type: ignore[union-attr]
    assert [t[2] for t in tried] == [attempt + 1 < zones for attempt in range(3)]


def test_a_regional_quota_skips_the_other_zones_of_the_region() -> None:
    request = gcp_l4()
    assert request.offer is not None
    tried, up = refusing(GCP_REGION_QUOTA)
    _, in_force = up_with_failover(up, request, alternatives(request), limit=5,
                                   on_move=lambda *_: None)
    assert [t[0] for t in tried] == [request.offer.region, in_force.offer.region]  # type: ignore[union-attr]
    assert in_force.offer.region != request.offer.region  # type: ignore[union-attr]


def test_a_global_quota_fails_at_once_naming_the_quota_and_how_to_raise_it() -> None:
    request = gcp_l4()
    tried, up = refusing(GCP_GLOBAL_QUOTA, GCP_GLOBAL_QUOTA)
    with pytest.raises(ProvisionError) as raised:
        up_with_failover(up, request, alternatives(request), limit=10, on_move=lambda *_: None)
    assert len(tried) == 1
    message = str(raised.value)
    assert "GPUS_ALL_REGIONS" in message and "every region" in message
    assert "IAM & Admin > Quotas" in message and GCP_GLOBAL_QUOTA in message


def test_a_global_quota_still_tries_another_cloud() -> None:
    request = gcp_l4()
    aws = offers.select([sky.Spec(sky.AWS(), sky.accelerators.L4())])
    places = alternatives(request) + spec_alternatives(request, [aws])
    tried, up = refusing(GCP_GLOBAL_QUOTA)
    _, in_force = up_with_failover(up, request, places, limit=10, on_move=lambda *_: None)
    assert len(tried) == 2 and in_force.spec.provider.kind == "aws"


def test_up_with_failover_gives_up_at_the_limit_and_on_other_errors() -> None:
    request = gcp_l4(1)
    tried, up = refusing(*[GCP_ZONE] * 5)
    with pytest.raises(ProvisionError, match="2 place.s. tried, the most Options"):
        up_with_failover(up, request, alternatives(request), limit=2, on_move=lambda *_: None)
    assert len(tried) == 2
    tried, up = refusing("UnauthorizedOperation: You are not authorized")
    with pytest.raises(ProvisionError, match="Unauthorized"):
        up_with_failover(up, request, alternatives(request), limit=5, on_move=lambda *_: None)
    assert len(tried) == 1  # not a refusal of the place: nowhere else would do better


def test_a_regional_refusal_with_nowhere_else_says_so() -> None:
    request = request_for(sky.Spec(sky.AWS(region="us-east-1"), None, vcpus=4,
                                   allocation="on-demand"))
    _tried, up = refusing("api error VcpuLimitExceeded: You have requested more vCPU capacity")
    with pytest.raises(ProvisionError) as raised:
        up_with_failover(up, request, alternatives(request), limit=5, on_move=lambda *_: None)
    assert "VcpuLimitExceeded (quota, region)" in str(raised.value)
    assert "'Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances'" in str(
        raised.value)


def test_a_multi_spec_pool_moves_to_the_next_spec_after_its_own_places() -> None:
    """AWS first (pinned region: no other region), then GCP: after the AWS places are
    exhausted the same stack declares the GCP Spec, at its own offer, on its own market."""
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

    def up(attempt: ClusterRequest, zone_next: bool) -> str:
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


def test_the_node_fallback_and_the_places_spend_one_budget() -> None:
    """Issue 30: a node moved by the fallback inside an ``up`` counts as one attempt of the
    sequence that failover's places spend too; the limit is reached sooner and says so."""
    from skyward_iac.api.retry import Attempts

    request = gcp_l4(1)
    attempts = Attempts(3)
    tried: list[ClusterRequest] = []

    def up(attempted: ClusterRequest, zone_next: bool) -> str:
        tried.append(attempted)
        if len(tried) == 1:
            assert attempts.spend() == 2  # the node fallback ran a second update here
        raise ProvisionError(GCP_ZONE)

    moves: list[int] = []
    with pytest.raises(ProvisionError, match="3 place.s. tried, the most Options"):
        up_with_failover(up, request, alternatives(request), attempts,
                         on_move=lambda r, p, n, why: moves.append(n))
    assert len(tried) == 2 and moves == [3] and attempts.made == 3
