"""The AWS provider's stack: network, security group, key pair, placement and EC2 instances.

Every resource goes through one explicit ``aws.Provider`` pinned to the offer's region (so a
later ``up`` or ``destroy`` never depends on the caller's ambient region) and carries the
cluster tags. On-demand and spot nodes are the same ``ec2.Instance``; spot adds market options
(one-time, terminate on interruption, max price = the spec's cost cap), so every node has the
same outputs and is replaced the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from skyward_iac.api.accelerators import vendor_of
from skyward_iac.infra.credentials import StackCredentials
from skyward_iac.infra.programs.exports import cluster_exports
from skyward_iac.infra.offers import Offer
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.programs import common
from skyward_iac.infra.programs.aws_network import Network, cluster_network
from skyward_iac.infra.programs.common import SELF, ClusterPlan, IngressRule
from skyward_iac.infra.programs.host_key import node_boot

CANONICAL = "099720109477"  # Ubuntu's publisher account


@dataclass(frozen=True, slots=True)
class AmiQuery:
    """Which AMI to look up: the newest image named like ``name`` from ``owners``."""

    owners: tuple[str, ...]
    name: str
    architecture: str
    min_disk_gb: int  # the image's root snapshot; a smaller root volume fails at launch


def ami_query(offer: Offer) -> AmiQuery:
    """The image family for an offer's architecture and accelerator vendor."""
    arch = "arm64" if offer.architecture == "arm64" else "x86_64"
    vendor = vendor_of(offer.accelerator) if offer.accelerator else None
    if vendor == "nvidia":
        arm = "ARM64 " if arch == "arm64" else ""
        return AmiQuery(("amazon",), f"Deep Learning {arm}Base OSS Nvidia Driver GPU AMI "
                        "(Ubuntu 22.04) *", arch, 75)
    if vendor == "aws":  # Trainium / Inferentia need the Neuron driver and SDK
        return AmiQuery(("amazon",), "Deep Learning AMI Neuron (Ubuntu 22.04) *", arch, 75)
    # 22.04 like the GPU images: its sshd starts after cloud-init installed the host key,
    # whereas 24.04's socket-activated sshd can accept a connection earlier.
    ubuntu_arch = "arm64" if arch == "arm64" else "amd64"
    return AmiQuery((CANONICAL,), f"ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-{ubuntu_arch}"
                    "-server-*", arch, 8)


def market_options(plan: ClusterPlan) -> dict[str, Any] | None:
    """``instance_market_options`` for a spot node, None on demand."""
    if plan.market != "spot":
        return None
    spot: dict[str, Any] = {
        "spot_instance_type": "one-time",
        "instance_interruption_behavior": "terminate",
    }
    if plan.spot_max_price is not None:
        spot["max_price"] = f"{plan.spot_max_price:.4f}"
    return {"market_type": "spot", "spot_options": spot}


def aws_program(request: ClusterRequest,
                ssh_cidr_lookup: Callable[[], str] | None = None) -> Callable[[], None]:
    """The program for ``request`` on AWS; the plan (offer, market, disk) is checked now."""
    plan = common.plan_cluster(request)
    ami = ami_query(plan.offer)
    common.check_disk(plan, ami.min_disk_gb, ami.name)
    provider_config = request.spec.provider

    def program() -> None:
        ssh_cidr = common.resolve_ssh_cidr(getattr(provider_config, "ssh_cidr", None),
                                           ssh_cidr_lookup)
        use_default_vpc = bool(getattr(provider_config, "use_default_vpc", True))
        common.export_cluster(declare_cluster(plan, ami, ssh_cidr, use_default_vpc))

    return program


def declare_cluster(plan: ClusterPlan, ami: AmiQuery, ssh_cidr: str,
                    use_default_vpc: bool) -> dict[str, Any]:
    """Declare every resource of the cluster and return the outputs to export."""
    tags = dict(plan.tags)
    provider = aws.Provider("aws", region=plan.offer.region, default_tags={"tags": tags})
    opts = pulumi.ResourceOptions(provider=provider)
    invoke = pulumi.InvokeOptions(provider=provider)
    credentials = StackCredentials("credentials", stack=plan.stack_name)

    network = cluster_network(plan, use_default_vpc, opts, invoke)
    group = _security_group(plan, network, common.ingress_rules(ssh_cidr), opts)
    key = aws.ec2.KeyPair(
        "ssh-key", key_name_prefix=f"{plan.stack_name}-", public_key=credentials.ssh_public_key,
        tags=tags, opts=opts,
    )
    placement = aws.ec2.PlacementGroup(
        "placement", strategy="cluster", tags=tags, opts=opts,
    ) if plan.placement else None
    image = aws.ec2.get_ami_output(
        most_recent=True, owners=list(ami.owners),
        filters=[{"name": "name", "values": [ami.name]},
                 {"name": "architecture", "values": [ami.architecture]},
                 {"name": "root-device-type", "values": ["ebs"]},
                 {"name": "virtualization-type", "values": ["hvm"]}],
        opts=invoke,
    )
    nodes = []
    for index in range(plan.node_count):
        host_key, user_data = node_boot(plan, credentials, index)
        instance = aws.ec2.Instance(
            f"node-{index}",
            ami=image.id,
            instance_type=plan.offer.machine_type,
            subnet_id=network.subnet_id,
            vpc_security_group_ids=[group.id],
            associate_public_ip_address=True,
            key_name=key.key_name,
            placement_group=placement.name if placement else None,
            # The TTL watchdog powers the node off; AWS must then delete it, not keep it stopped.
            instance_initiated_shutdown_behavior="terminate",
            instance_market_options=market_options(plan),
            root_block_device={
                "volume_size": plan.disk_gb, "volume_type": "gp3",
                "delete_on_termination": True, "encrypted": True, "tags": tags,
            },
            # IMDSv2 only, one hop: containers on the node cannot read the user data (host key).
            metadata_options={"http_endpoint": "enabled", "http_tokens": "required",
                              "http_put_response_hop_limit": 1},
            user_data=user_data,
            # Volumes (a later issue): bucket mounts attach an instance profile here.
            iam_instance_profile=None,
            tags={**tags, "Name": f"{plan.stack_name}-node-{index}", "skyward-node": str(index)},
            # A newer AMI published later must not replace running nodes on the next `up`.
            opts=pulumi.ResourceOptions(provider=provider, ignore_changes=["ami"]),
        )
        nodes.append(common.node_output(index, instance.private_ip, instance.public_ip,
                                        host_key.public_key))
    return cluster_exports(plan.stack_name, plan.collections, credentials, nodes)


def _security_group(plan: ClusterPlan, network: Network, rules: tuple[IngressRule, ...],
                    opts: pulumi.ResourceOptions) -> aws.ec2.SecurityGroup:
    tags = dict(plan.tags)
    group = aws.ec2.SecurityGroup(
        "cluster", name_prefix=f"{plan.stack_name}-", vpc_id=network.vpc_id,
        description=f"skyward_iac cluster {plan.stack_name}", tags=tags, opts=opts,
    )
    for rule in rules:
        aws.vpc.SecurityGroupIngressRule(
            f"ingress-{rule.name}", security_group_id=group.id, description=rule.description,
            tags=tags, opts=opts, **_rule_args(rule, group.id),
        )
    # Nodes need the internet for packages; the provider deletes AWS's default egress rule.
    aws.vpc.SecurityGroupEgressRule(
        "egress-all", security_group_id=group.id, ip_protocol="-1", cidr_ipv4="0.0.0.0/0",
        description="outbound to anywhere (packages, images)", tags=tags, opts=opts,
    )
    return group


def _rule_args(rule: IngressRule, group_id: pulumi.Output[str]) -> Mapping[str, Any]:
    args: dict[str, Any] = {"ip_protocol": "-1" if rule.protocol == "all" else rule.protocol}
    if rule.ports is not None:
        args["from_port"], args["to_port"] = rule.ports
    if rule.source == SELF:
        args["referenced_security_group_id"] = group_id
    elif ":" in rule.source:
        args["cidr_ipv6"] = rule.source
    else:
        args["cidr_ipv4"] = rule.source
    return args
