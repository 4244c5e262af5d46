"""spot-if-available: which engine errors move which nodes on demand, what the programs then
declare (Pulumi mocks), and the retry loop around ``up``."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.api.errors import ProvisionError
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.capacity.spot_fallback import (
    NodeFailures,
    node_retry,
    up_with_spot_fallback,
)
from skyward_iac.infra.capacity.zones import nodes_move_alone
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.programs.aws import aws_program
from skyward_iac.infra.programs.gcp import gcp_program
from skyward_iac.infra.programs.testing import ProgramMocks, run_program

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
CALLER = "198.51.100.7/32"
AWS_CAPACITY = ("creating EC2 Instance: operation error EC2: RunInstances, https response error "
                "StatusCode: 500, api error InsufficientInstanceCapacity: We currently do not "
                "have sufficient capacity in the Availability Zone you requested (us-east-1a).")
AWS_PRICE = "api error SpotMaxPriceTooLow: Your Spot request price of 0.1 is lower than 0.2"
AWS_UNOFFERED = ("api error Unsupported: Your requested instance type (m7i.xlarge) is not "
                 "supported in your requested Availability Zone (us-east-1a).")
AWS_SPOT_LIMIT = ("api error MaxSpotInstanceCountExceeded: Max spot instance count exceeded")
GCP_CAPACITY = ("Error waiting for instance to create: The zone 'projects/p/zones/us-central1-a' "
                "does not have enough resources available to fulfill the request. "
                "'(resource type:compute)'. (ZONE_RESOURCE_POOL_EXHAUSTED)")
QUOTA = "api error VcpuLimitExceeded: You have requested more vCPU capacity than your limit"


def request(allocation: str = "spot-if-available", provider: Any = None, nodes: int = 3,
            **fields: Any) -> ClusterRequest:
    spec = sky.Spec(provider=provider or sky.AWS(ssh_cidr=CALLER),
                    accelerator=sky.accelerators.A10G(), allocation=allocation)
    return ClusterRequest("fallback-test", spec, nodes, offer=offers.select([spec]).offer,
                          **fields)


@pytest.mark.parametrize("allocation", ["spot-if-available", "cheapest"])
def test_refused_nodes_move_on_demand(allocation: str) -> None:
    """A GPU pool of several nodes has a placement group: its nodes move only together."""
    retry = node_retry(request(allocation), {1: AWS_CAPACITY, 2: QUOTA})
    assert retry is not None and retry.on_demand_nodes == {1}  # node 2: a region's quota
    assert retry.node_zones == {}
    again = node_retry(retry, {0: GCP_CAPACITY})
    assert again is not None and again.on_demand_nodes == {0, 1}


@pytest.mark.parametrize(("allocation", "failures", "forced"), [
    ("spot", {0: AWS_CAPACITY}, None),  # "spot" means spot or nothing
    ("on-demand", {0: AWS_CAPACITY}, None),  # not on spot to begin with
    ("spot-if-available", {0: QUOTA}, None),  # the region's on-demand quota: failover's
    ("spot-if-available", {0: AWS_CAPACITY}, "on-demand"),  # already forced on demand
    ("spot-if-available", {0: AWS_UNOFFERED}, None),  # no market offers it in that zone
])
def test_no_fallback(allocation: str, failures: dict[int, str], forced: str | None) -> None:
    assert node_retry(request(allocation, market=forced), failures) is None


def test_a_node_already_on_demand_is_not_retried_again() -> None:
    assert node_retry(request(on_demand_nodes=frozenset({0})), {0: AWS_CAPACITY}) is None


def test_the_regional_spot_limit_and_a_spot_price_go_on_demand() -> None:
    retry = node_retry(request(), {0: AWS_SPOT_LIMIT, 1: AWS_PRICE})
    assert retry is not None and retry.on_demand_nodes == {0, 1}


def test_a_new_placement_pool_leaves_a_zone_refusal_to_failover_when_a_zone_is_next() -> None:
    """The whole pool tries the sibling zone (failover) before any node goes on demand."""
    assert node_retry(request(), {1: AWS_CAPACITY}, defer_zonal=True) is None
    # A regional refusal of spot is not a zone's: on demand, here.
    retry = node_retry(request(), {1: AWS_SPOT_LIMIT}, defer_zonal=True)
    assert retry is not None and retry.on_demand_nodes == {1}


def cpu_request(allocation: str = "spot-if-available", **fields: Any) -> ClusterRequest:
    """A CPU pool: no placement group, so each node may run in its own zone."""
    spec = sky.Spec(provider=sky.AWS(ssh_cidr=CALLER), vcpus=4, allocation=allocation)
    return ClusterRequest("fallback-test", spec, 3, offer=offers.select([spec]).offer,
                          **fields)


def test_a_node_that_moves_alone_tries_every_sibling_zone_before_on_demand() -> None:
    first = cpu_request()
    assert first.offer is not None and nodes_move_alone(first)
    zones = first.offer.zones
    attempts: dict[int, set[Any]] = {}
    current, seen = first, []
    for _ in range(2 * len(zones)):
        zone = current.node_zones.get(1, zones[0])
        market = "on-demand" if 1 in current.on_demand_nodes else "spot"
        seen.append((zone, market))
        attempts.setdefault(1, set()).add((zone, market))
        retry = node_retry(current, {1: AWS_CAPACITY.replace("us-east-1a", zone)}, attempts)
        if retry is None:
            break
        assert retry.node_zones.keys() <= {1} and not retry.on_demand_nodes - {1}
        current = retry
    assert seen[:len(zones)] == [(zone, "spot") for zone in zones]
    # On demand where spot was last refused, then through the other zones again.
    assert seen[len(zones)] == (zones[-1], "on-demand")
    assert {zone for zone, market in seen if market == "on-demand"} == set(zones)
    assert len(seen) == 2 * len(zones) and len(set(seen)) == len(seen)


def test_an_on_demand_node_that_moves_alone_tries_the_sibling_zones() -> None:
    first = cpu_request("on-demand")
    assert first.offer is not None
    retry = node_retry(first, {2: AWS_CAPACITY})
    assert retry is not None and retry.node_zones == {2: first.offer.zones[1]}
    assert retry.on_demand_nodes == frozenset()


def test_a_zone_not_offering_the_type_moves_the_node_but_never_on_demand() -> None:
    first = cpu_request()
    assert first.offer is not None
    retry = node_retry(first, {0: AWS_UNOFFERED})
    assert retry is not None and retry.node_zones == {0: first.offer.zones[1]}
    assert retry.on_demand_nodes == frozenset()


def test_aws_program_declares_refused_nodes_on_demand() -> None:
    mocks = ProgramMocks({"aws:ec2/getAmi:getAmi": {"id": "ami-1"},
                          "aws:ec2/getVpc:getVpc": {"id": "vpc-1"},
                          "aws:ec2/getSubnet:getSubnet": {"id": "subnet-1"},
                          "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings": {
                              "locations": ["us-east-1a"]}})
    run_program(aws_program(request(on_demand_nodes=frozenset({1}))), mocks)
    markets = [i.inputs.get("instanceMarketOptions") for i in
               mocks.of_type("aws:ec2/instance:Instance")]
    assert [m["marketType"] if m else None for m in markets] == ["spot", None, "spot"]


def test_gcp_program_declares_refused_nodes_standard() -> None:
    mocks = ProgramMocks()
    gcp = sky.GCP(ssh_cidr=CALLER, project="p")
    spec = sky.Spec(provider=gcp, accelerator=sky.accelerators.L4(), allocation="spot-if-available")
    run_program(gcp_program(ClusterRequest("fallback-test", spec, 2, on_demand_nodes=frozenset(
        {0}))), mocks)
    models = [i.inputs["scheduling"]["provisioningModel"]
              for i in mocks.of_type("gcp:compute/instance:Instance")]
    assert models == ["STANDARD", "SPOT"]


def diagnostic(node: int, message: str) -> SimpleNamespace:
    """An engine event as the Automation API delivers it (read by attribute name)."""
    urn = f"urn:pulumi:s::skyward::aws:ec2/instance:Instance::node-{node}"
    return SimpleNamespace(diagnostic_event=SimpleNamespace(urn=urn, severity="error",
                                                            message=message))


@dataclass
class RefusingStack:
    """Stands in for ``ClusterStack``: each ``up`` reports the next round's node errors (and
    fails) until the rounds run out; records every request it was given."""

    rounds: list[dict[int, str]]
    requests: list[ClusterRequest] = field(default_factory=list)
    name: str = "fallback-test"
    up_options: list[dict[str, Any]] = field(default_factory=list)

    def up(self, on_event: Any = None, **options: Any) -> str:
        self.up_options.append(options)
        if not self.rounds:
            return "outputs"
        for node, message in self.rounds.pop(0).items():
            on_event(diagnostic(node, message))
        raise ProvisionError("pulumi up of stack 'fallback-test' failed")

    def set_request(self, request: ClusterRequest) -> None:
        self.requests.append(request)


def test_up_retries_until_every_refused_node_is_on_demand(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stack = RefusingStack([{2: AWS_CAPACITY}, {0: AWS_SPOT_LIMIT}])
    seen: list[Any] = []
    outputs, final = up_with_spot_fallback(stack, request(), seen.append)  # type: ignore[arg-type]
    assert outputs == "outputs"
    assert [r.on_demand_nodes for r in stack.requests] == [{2}, {0, 2}]
    assert final.on_demand_nodes == {0, 2}
    assert len(seen) == 2, "events still reach the caller's on_event"
    assert "the cloud refused node(s) 2" in caplog.text and "node 2 -> on demand" in caplog.text


def test_up_raises_when_the_failure_is_not_capacity() -> None:
    stack = RefusingStack([{0: QUOTA}])
    with pytest.raises(ProvisionError):
        up_with_spot_fallback(stack, request())  # type: ignore[arg-type]
    assert stack.requests == []


def test_node_failures_ignore_other_resources_and_warnings() -> None:
    failures = NodeFailures()
    failures(SimpleNamespace(diagnostic_event=SimpleNamespace(
        urn="urn:pulumi:s::skyward::aws:ec2/keyPair:KeyPair::ssh-key", severity="error",
        message=AWS_CAPACITY)))
    failures(SimpleNamespace(diagnostic_event=SimpleNamespace(
        urn="urn:pulumi:s::skyward::aws:ec2/instance:Instance::node-1", severity="warning",
        message=AWS_CAPACITY)))
    failures(diagnostic(3, GCP_CAPACITY))
    assert failures.by_node == {3: GCP_CAPACITY}


def test_a_replacement_falls_back_too_with_its_own_up_options() -> None:
    """Replacements and resizes go through the same fallback; each attempt keeps the
    caller's options (refresh, the node to recreate)."""
    stack = RefusingStack([{1: GCP_CAPACITY}])
    options = {"refresh": True, "message": "skyward: replace node 1", "replace_nodes": (1,)}
    _, final = up_with_spot_fallback(stack, request(), **options)  # type: ignore[arg-type]
    assert final.on_demand_nodes == {1}
    assert stack.up_options == [options, options]


def test_up_moves_a_node_through_the_zones_then_on_demand() -> None:
    """The loop remembers where each node was refused: a CPU pool's node 1, refused in every
    zone on spot, then runs on demand."""
    first = cpu_request()
    assert first.offer is not None
    zones = first.offer.zones
    stack = RefusingStack([{1: AWS_CAPACITY.replace("us-east-1a", zone)} for zone in zones])
    _, final = up_with_spot_fallback(stack, first)  # type: ignore[arg-type]
    assert [r.node_zones.get(1) for r in stack.requests] == [*zones[1:], zones[-1]]
    assert final.on_demand_nodes == {1} and final.node_zones == {1: zones[-1]}


def test_each_node_move_is_one_announced_attempt_of_a_bounded_sequence() -> None:
    """Issue 30: a node moved to a sibling zone is one attempt of the sequence
    ``Options(max_provision_attempts)`` bounds, announced with its reason; once the sequence
    is spent the refusal is raised (capacity failover then says the limit was reached)."""
    from skyward_iac.api.retry import Attempts

    first = cpu_request()
    assert first.offer is not None and len(first.offer.zones) >= 3
    zones = first.offer.zones
    stack = RefusingStack([{1: AWS_CAPACITY.replace("us-east-1a", zone)} for zone in zones])
    announced: list[tuple[int, str, str]] = []
    attempts = Attempts(3)
    with pytest.raises(ProvisionError):
        up_with_spot_fallback(stack, first, attempts=attempts,  # type: ignore[arg-type]
                              on_retry=lambda r, n, reason, moved: announced.append(
                                  (n, reason, moved)))
    assert [n for n, _, _ in announced] == [2, 3]
    assert all("InsufficientInstanceCapacity" in reason for _, reason, _ in announced)
    assert announced[0][2] == f"node 1 -> {zones[1]}"
    assert len(stack.up_options) == 3 and attempts.cut_short  # 3 updates, the 4th refused


class LeasedStack(RefusingStack):
    """A ``RefusingStack`` a pool's parts can be built on (its lease's first renewal is
    minutes away) whose failed ``up`` names the refusals, as the engine's stderr does."""

    def up(self, on_event: Any = None, **options: Any) -> str:
        errors = "\n".join(self.rounds[0].values()) if self.rounds else ""
        try:
            return super().up(on_event, **options)
        except ProvisionError as exc:
            raise ProvisionError(f"{exc}:\n{errors}") from None

    def renew_lease(self, until: str) -> None:
        raise AssertionError("not renewed within the test")


def test_a_pool_announces_every_node_move_and_stops_at_max_provision_attempts() -> None:
    """The reconciler wires the node fallback to the pool's events: each node moved to a
    sibling zone is a ``ProvisionRetried`` with the cloud's reason and what moved, and
    ``Options(max_provision_attempts)`` bounds the updates (issue 30)."""
    import threading

    from skyward_iac.observability.bus import EventBus
    from skyward_iac.observability.events import ProvisionRetried
    from skyward_iac.orchestration.parts import PoolParts
    from skyward_iac.orchestration.plan import plan_pool

    plan = plan_pool([sky.Spec(provider=sky.AWS(ssh_cidr=CALLER), vcpus=4, nodes=3,
                               allocation="spot")],
                     None, sky.Options(console=False, max_provision_attempts=3), {})
    assert plan.request.offer is not None and nodes_move_alone(plan.request)
    zones = plan.request.offer.zones
    stack = LeasedStack([{1: AWS_CAPACITY.replace("us-east-1a", zone)} for zone in zones],
                        name=plan.stack_name)
    events, seen = EventBus(), []
    events.subscribe(seen.append, ProvisionRetried)
    before = set(threading.enumerate())
    parts = PoolParts(plan, stack, events, lambda *_: None,  # type: ignore[arg-type]
                      lambda error: None)
    try:
        with pytest.raises(ProvisionError, match="3 place.s. tried, the most Options"):
            parts.reconciler._up(plan.request, None)  # type: ignore[arg-type]
    finally:
        parts.discard("test over")
    assert len(stack.up_options) == 3
    assert [(e.attempt, e.why) for e in seen] == [(2, f"node 1 -> {zones[1]}"),
                                                   (3, f"node 1 -> {zones[2]}")]
    assert all("InsufficientInstanceCapacity" in e.reason and e.region == plan.request.offer.region
               for e in seen)
    assert set(threading.enumerate()) <= before | {threading.current_thread()}
