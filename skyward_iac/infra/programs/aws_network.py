"""Where AWS nodes live: subnets of the default VPC, or of a VPC of the cluster's own, one per
zone the pool may use, and how nodes attach to them (an EFA for multi-node pools of types that
have one).

The pool's zone (``decisions.py`` stores it) holds every node of a pool with a placement group
(a cluster placement group, and so an EFA pool, lives in one zone). Other pools may run each
node in its own zone of the region: a node the cloud refused in one zone is declared in a
sibling zone (``capacity/spot_fallback.py``), and each node's zone is stored with it, so no
later update moves it. A VPC of the pool's own gets a subnet in each zone the pool may use (the
pool's zone keeps the first CIDR block and the logical name ``subnet`` it always had); the
default VPC's subnet of each zone a node uses is looked up (a default VPC may lack one in a
zone nobody uses).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from skyward_iac.api.errors import ConfigError
from skyward_iac.infra.capacity.zones import declared_zones
from skyward_iac.infra.programs.common import ClusterPlan

VPC_CIDR = "10.42.0.0/16"
SUBNET_CIDR = "10.42.0.0/20"
#: /20 blocks of ``VPC_CIDR``: the pool's zone has the first, each other zone the one its letter
#: names (a -> the second ... o -> the sixteenth), so a zone's block never depends on the others.
SUBNET_BLOCKS = 16
#: Types whose primary interface can be an Elastic Fabric Adapter (from AWS's list of EFA
#: instance types; one missing here keeps its plain ENA, which NCCL uses over TCP).
EFA_TYPES = frozenset({
    "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge",
    "p6-b200.48xlarge", "g5.48xlarge", "g6.48xlarge", "g6e.48xlarge", "trn1.32xlarge",
    "trn1n.32xlarge",
})


@dataclass(frozen=True, slots=True)
class Network:
    """The VPC and the subnet of each zone the cluster's nodes may be placed in."""

    vpc_id: pulumi.Output[str]
    #: The pool's zone: placement-group pools keep every node there.
    zone: str
    #: Zone -> subnet id, for the pool's zone and every other zone nodes use (or may use).
    subnets: Mapping[str, pulumi.Output[str]]

    @property
    def subnet_id(self) -> pulumi.Output[str]:
        """The pool zone's subnet."""
        return self.subnets[self.zone]


def subnet_cidr(zone: str, pool_zone: str) -> str:
    """The /20 of ``VPC_CIDR`` for ``zone``'s subnet (see ``SUBNET_BLOCKS``)."""
    if zone == pool_zone:
        return SUBNET_CIDR
    letter = zone[-1:]
    block = ord(letter) - ord("a") + 1 if letter.isascii() and letter.islower() else SUBNET_BLOCKS
    if block >= SUBNET_BLOCKS:
        raise ConfigError(f"zone {zone} has no subnet block in {VPC_CIDR}: zones a to o only")
    return f"10.42.{block * 16}.0/20"


def node_zones(plan: ClusterPlan, pool_zone: str, pinned: Mapping[int, str | None],
               moved: Mapping[int, str]) -> dict[int, str]:
    """The zone of every node ``plan`` declares (``zones.declared_zones``): a placement
    group holds the pool in one zone."""
    return declared_zones(plan.node_count, pool_zone, pinned, moved, together=plan.placement)


def network_zones(plan: ClusterPlan, use_default_vpc: bool, pool_zone: str,
                  usable: tuple[str, ...], used: Mapping[int, str]) -> list[str]:
    """The zones that get a subnet: the pool's first, then every zone a node uses and, in a
    VPC of the pool's own, every zone the pool may use (one zone for placement-group pools)."""
    zones = {pool_zone, *used.values()}
    if not use_default_vpc and not plan.placement:
        zones |= set(usable)
    return [pool_zone, *sorted(zones - {pool_zone})]


def cluster_network(plan: ClusterPlan, use_default_vpc: bool, opts: pulumi.ResourceOptions,
                    invoke: pulumi.InvokeOptions, zones: list[str]) -> Network:
    """The network for ``plan`` with a subnet in each of ``zones`` (the pool's first): the
    default VPC (``AWS(use_default_vpc=True)``) or a new one."""
    if use_default_vpc:
        vpc = aws.ec2.get_vpc_output(default=True, opts=invoke)
        return Network(vpc.id, zones[0], {zone: aws.ec2.get_subnet_output(
            vpc_id=vpc.id, availability_zone=zone, default_for_az=True, opts=invoke).id
            for zone in zones})
    return _own_vpc(plan, zones, opts)


def _own_vpc(plan: ClusterPlan, zones: list[str], opts: pulumi.ResourceOptions) -> Network:
    tags = dict(plan.tags)
    vpc = aws.ec2.Vpc("vpc", cidr_block=VPC_CIDR, enable_dns_hostnames=True,
                      enable_dns_support=True, tags={**tags, "Name": plan.stack_name}, opts=opts)
    gateway = aws.ec2.InternetGateway("gateway", vpc_id=vpc.id, tags=tags, opts=opts)
    routes = aws.ec2.RouteTable(
        "routes", vpc_id=vpc.id, routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0",
                                                                 gateway_id=gateway.id)],
        tags=tags, opts=opts,
    )
    subnets = {}
    for zone in zones:
        # The pool's zone keeps the names of the stack's only subnet before zones were many.
        suffix = "" if zone == zones[0] else f"-{zone}"
        subnet = aws.ec2.Subnet(
            f"subnet{suffix}", vpc_id=vpc.id, cidr_block=subnet_cidr(zone, zones[0]),
            availability_zone=zone, map_public_ip_on_launch=True, tags=tags, opts=opts,
        )
        aws.ec2.RouteTableAssociation(f"subnet-routes{suffix}", subnet_id=subnet.id,
                                      route_table_id=routes.id, opts=opts)
        subnets[zone] = subnet.id
    return Network(vpc.id, zones[0], subnets)


def uses_efa(plan: ClusterPlan) -> bool:
    """Whether the nodes' primary interface is an EFA: a type that has one, in a pool that may
    hold several nodes. Decided like placement, from the pool's maximum, so a 1 -> 2 resize
    never changes (and so never replaces) the head node's interface."""
    return plan.placement and plan.offer.machine_type in EFA_TYPES


def efa_launch_template(plan: ClusterPlan, network: Network, group_id: pulumi.Input[str],
                        opts: pulumi.ResourceOptions) -> aws.ec2.LaunchTemplate:
    """A launch template whose only interface (card 0, device 0) is an EFA in the pool zone's
    subnet and the cluster's security group, with a public address like every node's;
    ``ec2.Instance`` cannot declare the interface type itself."""
    tags = dict(plan.tags)
    return aws.ec2.LaunchTemplate(
        "efa", name_prefix=f"{plan.stack_name}-", tags=tags,
        description=f"skyward_iac {plan.stack_name}: EFA primary interface",
        network_interfaces=[aws.ec2.LaunchTemplateNetworkInterfaceArgs(
            device_index=0, network_card_index=0, interface_type="efa",
            subnet_id=network.subnet_id, security_groups=[group_id],
            associate_public_ip_address="true", delete_on_termination="true",
        )],
        opts=opts,
    )
