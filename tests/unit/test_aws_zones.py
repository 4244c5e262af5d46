"""AWS zones under Pulumi mocks: a subnet per zone a pool may use, a zone per node, stored
with it, and never moved by a resize, a refusal elsewhere or a change of the offerings."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.programs import ClusterRequest, pins
from skyward_iac.infra.programs.aws import aws_program
from skyward_iac.infra.programs.aws_network import SUBNET_CIDR, subnet_cidr
from skyward_iac.infra.programs.testing import AWS_INVOKES, ProgramMocks, run_program
from tests.unit import test_aws_program as aws_tests

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
INSTANCE = "aws:ec2/instance:Instance"
SUBNET = "aws:ec2/subnet:Subnet"
GET_SUBNET = "aws:ec2/getSubnet:getSubnet"
CPU = aws_tests.aws_spec(None, vcpus=4, allocation="spot-if-available")
CPU_OWN_VPC = aws_tests.aws_spec(None, vcpus=4, use_default_vpc=False)
GPU_POOL = aws_tests.aws_spec(sky.accelerators.A10G(), use_default_vpc=False)


class SubnetMocks(ProgramMocks):
    """The default VPC's subnet of each zone has its own id, as in a real account."""

    def call(self, args: Any) -> dict[str, Any]:
        if args.token == GET_SUBNET:
            self.calls.append((args.token, dict(args.args)))
            return {"id": f"subnet-{args.args['availabilityZone']}"}
        return super().call(args)


def request(spec: sky.Spec, nodes: int, **fields: Any) -> ClusterRequest:
    return ClusterRequest("zones", spec, nodes, offer=offers.select([spec]).offer, **fields)


def run(req: ClusterRequest, stored: dict[str, str] | None = None
        ) -> tuple[SubnetMocks, dict[str, str]]:
    """One run of the program for ``req`` on a stack that stores ``stored``; the mocks and
    what the stack stores after it."""
    program = aws_program(req, lambda: aws_tests.CALLER)
    mocks = SubnetMocks(AWS_INVOKES)
    run_program(program, mocks, pins.config_values(stored or {}))
    return mocks, {**(stored or {}), **program.unstored()}


def subnet_zones(mocks: SubnetMocks) -> dict[str, str]:
    """Logical subnet name -> its zone, for a VPC of the pool's own."""
    return {s.name: s.inputs["availabilityZone"] for s in mocks.of_type(SUBNET)}


def instance_subnets(mocks: SubnetMocks) -> dict[str, str]:
    return {i.name: i.inputs["subnetId"] for i in mocks.of_type(INSTANCE)}


def test_a_vpc_of_its_own_has_a_subnet_in_every_zone_the_pool_may_use() -> None:
    req = request(CPU_OWN_VPC, 2)
    assert req.offer is not None and len(req.offer.zones) > 2
    mocks, _ = run(req)
    zones = req.offer.zones
    assert subnet_zones(mocks) == {"subnet": zones[0],
                                   **{f"subnet-{zone}": zone for zone in zones[1:]}}
    blocks = {s.inputs["cidrBlock"] for s in mocks.of_type(SUBNET)}
    assert len(blocks) == len(zones) and mocks.named("subnet").inputs["cidrBlock"] == SUBNET_CIDR
    associations = mocks.of_type("aws:ec2/routeTableAssociation:RouteTableAssociation")
    assert len(associations) == len(zones)


def test_a_node_moved_to_a_sibling_zone_uses_that_zones_subnet() -> None:
    req = request(CPU_OWN_VPC, 3)
    assert req.offer is not None
    zones = req.offer.zones
    mocks, stored = run(replace(req, node_zones={2: zones[2]}))
    assert instance_subnets(mocks) == {"node-0": "subnet-id", "node-1": "subnet-id",
                                       "node-2": f"subnet-{zones[2]}-id"}
    assert json.loads(stored[pins.NODES]) == {
        "0": {"image": stored[pins.IMAGE], "zone": zones[0]},
        "1": {"image": stored[pins.IMAGE], "zone": zones[0]},
        "2": {"image": stored[pins.IMAGE], "zone": zones[2]}}
    assert stored[pins.ZONE] == zones[0]


def test_the_default_vpc_is_asked_only_for_the_zones_nodes_use() -> None:
    req = request(CPU, 2)
    assert req.offer is not None
    zones = req.offer.zones
    mocks, _ = run(replace(req, node_zones={1: zones[3]}))
    asked = [args["availabilityZone"] for token, args in mocks.calls if token == GET_SUBNET]
    assert asked == [zones[0], zones[3]]
    assert instance_subnets(mocks) == {"node-0": f"subnet-{zones[0]}",
                                       "node-1": f"subnet-{zones[3]}"}


def test_a_placement_pool_keeps_every_node_in_its_zone() -> None:
    """A cluster placement group lives in one zone: a moved node would not launch in it."""
    req = request(GPU_POOL, 2, max_nodes=4)
    assert req.offer is not None
    mocks, stored = run(replace(req, node_zones={1: req.offer.zones[1]}))
    assert mocks.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert subnet_zones(mocks) == {"subnet": req.offer.zones[0]}
    assert set(instance_subnets(mocks).values()) == {"subnet-id"}
    assert {pin["zone"] for pin in json.loads(stored[pins.NODES]).values()} == {
        req.offer.zones[0]}


def test_zones_stay_across_a_resize_and_a_change_of_the_offerings() -> None:
    req = request(CPU_OWN_VPC, 2)
    assert req.offer is not None
    a, b, c, *rest = req.offer.zones
    first, stored = run(replace(req, node_zones={1: b}))
    # Later: the offerings no longer list the pool's zone nor node 1's; the pool grows by one
    # and a warm adopter's request moves nothing (no zone, no node zones of its own).
    moved_offer = replace(req.offer, zones=(c, *rest))
    later, stored = run(replace(req, node_count=3, offer=moved_offer), stored)
    assert instance_subnets(later)["node-0"] == instance_subnets(first)["node-0"] == "subnet-id"
    assert instance_subnets(later)["node-1"] == instance_subnets(first)["node-1"]
    assert subnet_zones(later)["subnet"] == a and subnet_zones(later)[f"subnet-{b}"] == b
    for name in ("subnet", f"subnet-{b}"):
        assert later.named(name).inputs["cidrBlock"] == first.named(name).inputs["cidrBlock"]
    # The new node goes to the pool's zone, which the stack stored.
    assert instance_subnets(later)["node-2"] == "subnet-id"
    assert {i: pin["zone"] for i, pin in json.loads(stored[pins.NODES]).items()} == {
        "0": a, "1": b, "2": a}
    assert stored[pins.ZONE] == a


def test_nodes_stored_before_zones_were_stored_stay_in_the_pool_zone() -> None:
    req = request(CPU, 2)
    assert req.offer is not None
    _, stored = run(req)
    old = {**stored, pins.NODES: json.dumps({"0": {"image": stored[pins.IMAGE]},
                                             "1": {"image": stored[pins.IMAGE]}})}
    mocks, after = run(replace(req, node_zones={1: req.offer.zones[2]}), old)
    pool = stored[pins.ZONE]
    assert set(instance_subnets(mocks).values()) == {f"subnet-{pool}"}
    assert {pin["zone"] for pin in json.loads(after[pins.NODES]).values()} == {pool}


@pytest.mark.parametrize(("zone", "pool", "cidr"), [
    ("us-east-1c", "us-east-1c", SUBNET_CIDR),
    ("us-east-1a", "us-east-1c", "10.42.16.0/20"),
    ("us-east-1f", "us-east-1a", "10.42.96.0/20"),
])
def test_a_zones_block_depends_on_nothing_but_the_zone(zone: str, pool: str, cidr: str) -> None:
    assert subnet_cidr(zone, pool) == cidr


def test_a_type_no_zone_of_its_region_offers_fails_before_any_stack() -> None:
    req = request(CPU, 1)
    assert req.offer is not None
    unoffered = replace(req.offer, instance_type="p3.2xlarge", machine_type="p3.2xlarge",
                        zones=())
    with pytest.raises(sky.ConfigError, match=r"p3\.2xlarge is not offered in any zone of "
                                              r"us-east-1.*no region of the catalog"):
        aws_program(replace(req, offer=unoffered))
