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
    on_demand_retry,
    spot_capacity_refused,
    up_with_spot_fallback,
)
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.programs.aws import aws_program
from skyward_iac.infra.programs.gcp import gcp_program
from skyward_iac.infra.programs.testing import ProgramMocks, run_program

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
CALLER = "198.51.100.7/32"
AWS_CAPACITY = ("creating EC2 Instance: operation error EC2: RunInstances, https response error "
                "StatusCode: 500, api error InsufficientInstanceCapacity: There is no Spot "
                "capacity available that matches your request.")
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


@pytest.mark.parametrize("text", [AWS_CAPACITY, AWS_SPOT_LIMIT, GCP_CAPACITY])
def test_capacity_errors_are_recognised(text: str) -> None:
    assert spot_capacity_refused(text)


@pytest.mark.parametrize("text", [QUOTA, "api error SpotMaxPriceTooLow", "InvalidAMIID.NotFound"])
def test_other_errors_are_not_capacity(text: str) -> None:
    assert not spot_capacity_refused(text)


@pytest.mark.parametrize("allocation", ["spot-if-available", "cheapest"])
def test_refused_nodes_move_on_demand(allocation: str) -> None:
    retry = on_demand_retry(request(allocation), {1: AWS_CAPACITY, 2: QUOTA})
    assert retry is not None and retry.on_demand_nodes == {1}  # node 2 failed for another reason
    again = on_demand_retry(retry, {0: GCP_CAPACITY})
    assert again is not None and again.on_demand_nodes == {0, 1}


@pytest.mark.parametrize(("allocation", "failures", "forced"), [
    ("spot", {0: AWS_CAPACITY}, None),  # "spot" means spot or nothing
    ("on-demand", {0: AWS_CAPACITY}, None),  # not on spot to begin with
    ("spot-if-available", {0: QUOTA}, None),  # not a capacity error
    ("spot-if-available", {0: AWS_CAPACITY}, "on-demand"),  # already forced on demand
])
def test_no_fallback(allocation: str, failures: dict[int, str], forced: str | None) -> None:
    assert on_demand_retry(request(allocation, market=forced), failures) is None


def test_a_node_already_on_demand_is_not_retried_again() -> None:
    assert on_demand_retry(request(on_demand_nodes=frozenset({0})), {0: AWS_CAPACITY}) is None


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
    assert "no spot capacity for node(s) 2" in caplog.text


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
