"""Where AWS nodes live: the default VPC's subnet, or a VPC of the cluster's own, and how they
attach to it (an EFA for multi-node pools of types that have one).

Both paths put every node in one subnet of one availability zone (placement groups and low
latency between nodes need it), picked among the zones that offer the instance type by the
stack's first run and kept for the stack's life (``decisions.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from skyward_iac.infra.programs.common import ClusterPlan

VPC_CIDR = "10.42.0.0/16"
SUBNET_CIDR = "10.42.0.0/20"
#: Types whose primary interface can be an Elastic Fabric Adapter (from AWS's list of EFA
#: instance types; one missing here keeps its plain ENA, which NCCL uses over TCP).
EFA_TYPES = frozenset({
    "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge",
    "p6-b200.48xlarge", "g5.48xlarge", "g6.48xlarge", "g6e.48xlarge", "trn1.32xlarge",
    "trn1n.32xlarge",
})


@dataclass(frozen=True, slots=True)
class Network:
    """The VPC and subnet the cluster's nodes are placed in."""

    vpc_id: pulumi.Output[str]
    subnet_id: pulumi.Output[str]
    availability_zone: pulumi.Output[str]


def first_zone(locations: list[str]) -> str:
    """The zone to use among those offering the type: the first by name, so `up` is stable."""
    if not locations:
        raise ValueError("no availability zone of this region offers the instance type")
    return sorted(locations)[0]


def cluster_network(plan: ClusterPlan, use_default_vpc: bool, opts: pulumi.ResourceOptions,
                    invoke: pulumi.InvokeOptions, zone: str | None = None) -> Network:
    """The network for ``plan``: the default VPC (``AWS(use_default_vpc=True)``) or a new one,
    in ``zone`` (the stack's, ``decisions.py``), else the first offering the type."""
    zone_output = pulumi.Output.from_input(zone) if zone else offering_zone(plan, invoke)
    return _network(plan, use_default_vpc, opts, invoke, zone_output)


def offering_zone(plan: ClusterPlan, invoke: pulumi.InvokeOptions) -> pulumi.Output[str]:
    """The first zone of the region that offers the plan's instance type (``first_zone``)."""
    offerings = aws.ec2.get_instance_type_offerings_output(
        location_type="availability-zone",
        filters=[aws.ec2.GetInstanceTypeOfferingsFilterArgs(
            name="instance-type", values=[plan.offer.machine_type])],
        opts=invoke,
    )
    return offerings.locations.apply(first_zone)


def _network(plan: ClusterPlan, use_default_vpc: bool, opts: pulumi.ResourceOptions,
             invoke: pulumi.InvokeOptions, zone: pulumi.Output[str]) -> Network:
    if use_default_vpc:
        vpc = aws.ec2.get_vpc_output(default=True, opts=invoke)
        subnet = aws.ec2.get_subnet_output(
            vpc_id=vpc.id, availability_zone=zone, default_for_az=True, opts=invoke,
        )
        return Network(vpc.id, subnet.id, zone)
    return _own_vpc(plan, zone, opts)


def _own_vpc(plan: ClusterPlan, zone: pulumi.Output[str], opts: pulumi.ResourceOptions) -> Network:
    tags = dict(plan.tags)
    vpc = aws.ec2.Vpc("vpc", cidr_block=VPC_CIDR, enable_dns_hostnames=True,
                      enable_dns_support=True, tags={**tags, "Name": plan.stack_name}, opts=opts)
    gateway = aws.ec2.InternetGateway("gateway", vpc_id=vpc.id, tags=tags, opts=opts)
    routes = aws.ec2.RouteTable(
        "routes", vpc_id=vpc.id, routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0",
                                                                 gateway_id=gateway.id)],
        tags=tags, opts=opts,
    )
    subnet = aws.ec2.Subnet(
        "subnet", vpc_id=vpc.id, cidr_block=SUBNET_CIDR, availability_zone=zone,
        map_public_ip_on_launch=True, tags=tags, opts=opts,
    )
    aws.ec2.RouteTableAssociation("subnet-routes", subnet_id=subnet.id, route_table_id=routes.id,
                                  opts=opts)
    return Network(vpc.id, subnet.id, zone)


def uses_efa(plan: ClusterPlan) -> bool:
    """Whether the nodes' primary interface is an EFA: a type that has one, in a pool that may
    hold several nodes. Decided like placement, from the pool's maximum, so a 1 -> 2 resize
    never changes (and so never replaces) the head node's interface."""
    return plan.placement and plan.offer.machine_type in EFA_TYPES


def efa_launch_template(plan: ClusterPlan, network: Network, group_id: pulumi.Input[str],
                        opts: pulumi.ResourceOptions) -> aws.ec2.LaunchTemplate:
    """A launch template whose only interface (card 0, device 0) is an EFA in the cluster's
    subnet and security group, with a public address like every node's; ``ec2.Instance`` cannot
    declare the interface type itself."""
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
