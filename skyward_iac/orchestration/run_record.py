"""What a pool writes in its stack's tags about its run, beyond its spec: where its nodes run
(instance type, region, zones, market) and its nodes over time (the ``CostMeter``'s segments),
so any machine can tell afterwards what ran where and what it used (``skyward-iac history``,
``skyward-iac cost``). Pure functions of the plan, the request in force and the meter.
"""

from __future__ import annotations

from collections.abc import Sequence

from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.stacks import usage
from skyward_iac.infra.stacks.tags import SEGMENTS, placement_tags
from skyward_iac.orchestration.cost import CostMeter
from skyward_iac.orchestration.plan import PoolPlan


def placement(plan: PoolPlan, request: ClusterRequest,
              zones: Sequence[str] = ()) -> dict[str, str]:
    """Where ``request`` (the request in force: a failover may have moved it) puts the nodes;
    ``zones``: those the stack's last run placed them in, when the provider says."""
    offer = request.offer or plan.choice.offer
    market = request.market or plan.choice.market
    return placement_tags(offer.instance_type, offer.region,
                          [*zones, *([request.zone] if request.zone else [])], market,
                          len(request.on_demand_nodes), request.node_count)


def run_tags(plan: PoolPlan, request: ClusterRequest, meter: CostMeter,
             zones: Sequence[str] = ()) -> dict[str, str]:
    """The tags that change while the pool runs: its node count and rate now, where it runs,
    and its segments once there is more than the one the first two imply."""
    segments = meter.segments()
    tags = {"nodes": str(request.node_count), "usd_per_hour": f"{meter.rate:.4f}",
            **placement(plan, request, zones)}
    if len(segments) > 1 or segments[0].start_s > 0:
        tags[SEGMENTS] = usage.encode(segments)
    return tags
