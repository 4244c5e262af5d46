"""The AWS provider's stack: network, security group, key pair, placement and EC2 instances.

Every resource goes through one explicit ``aws.Provider`` pinned to the offer's region and to
the account the stack was created in (``pins``), so a later ``up``, ``refresh`` or ``destroy``
never depends on the caller's ambient region or account; every resource carries the cluster
tags. On-demand and spot nodes are the same ``ec2.Instance``; spot adds market options
(one-time, terminate on interruption, max price = the spec's cost cap), so every node has the
same outputs and is replaced the same way. Multi-node pools of EFA instance types attach
through a launch template whose primary interface is an EFA (``aws_network.uses_efa``). The
AMI (an id, looked up once), the pool's zone and each node's zone (the pool's, or the sibling
zone a capacity refusal moved it to: ``aws_network.py``) are decided by the run that creates
them and declared again by every later one (``decisions.py``), as are the tags and lifetime in
each node's inputs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

from skyward_iac.api.accelerators import vendor_of
from skyward_iac.api.volumes import Volume
from skyward_iac.infra.capacity.offers import Offer
from skyward_iac.infra.capacity.zones import usable_zones
from skyward_iac.infra.identity.credentials import StackCredentials
from skyward_iac.infra.programs import ClusterRequest, common, decisions, pins
from skyward_iac.infra.programs.aws_network import (
    Network,
    cluster_network,
    efa_launch_template,
    network_zones,
    node_zones,
    uses_efa,
)
from skyward_iac.infra.programs.common import SELF, ClusterPlan, IngressRule
from skyward_iac.infra.programs.decisions import Decided, Recorder, StackProgram
from skyward_iac.infra.programs.exports import cluster_exports, volume_exports
from skyward_iac.infra.programs.host_key import node_boot

CANONICAL = "099720109477"  # Ubuntu's publisher account


@dataclass(frozen=True, slots=True)
class AmiQuery:
    """Which AMI to look up: the newest image named like ``name`` from ``owners``."""

    owners: tuple[str, ...]
    name: str
    architecture: str
    min_disk_gb: int  # the image's root snapshot; a smaller root volume fails at launch
    #: The GPU driver the image ships (``common.DRIVER_RUNS``), None without one.
    driver: str | None = None


def ami_query(offer: Offer) -> AmiQuery:
    """The image family for an offer's architecture and accelerator vendor."""
    arch = "arm64" if offer.architecture == "arm64" else "x86_64"
    vendor = vendor_of(offer.accelerator) if offer.accelerator else None
    if vendor == "nvidia":
        arm = "ARM64 " if arch == "arm64" else ""
        # P3 (V100) and older need the proprietary driver: the OSS image cannot run them.
        driver = common.nvidia_driver_for(offer.accelerator or "")
        flavour = "Proprietary" if driver == "nvidia-proprietary" else "OSS"
        return AmiQuery(("amazon",), f"Deep Learning {arm}Base {flavour} Nvidia Driver GPU AMI "
                        "(Ubuntu 22.04) *", arch, 75, driver)
    if vendor == "aws":  # Trainium / Inferentia need the Neuron driver and SDK
        return AmiQuery(("amazon",), "Deep Learning AMI Neuron (Ubuntu 22.04) *", arch, 75)
    # 22.04 like the GPU images: its sshd starts after cloud-init installed the host key,
    # whereas 24.04's socket-activated sshd can accept a connection earlier.
    ubuntu_arch = "arm64" if arch == "arm64" else "amd64"
    return AmiQuery((CANONICAL,), f"ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-{ubuntu_arch}"
                    "-server-*", arch, 8)


def market_options(plan: ClusterPlan,
                   node: int) -> aws.ec2.InstanceInstanceMarketOptionsArgs | None:
    """``instance_market_options`` for a spot node, None for one on demand."""
    if plan.node_market(node) != "spot":
        return None
    max_price = f"{plan.spot_max_price:.4f}" if plan.spot_max_price is not None else None
    return aws.ec2.InstanceInstanceMarketOptionsArgs(
        market_type="spot",
        spot_options=aws.ec2.InstanceInstanceMarketOptionsSpotOptionsArgs(
            spot_instance_type="one-time", instance_interruption_behavior="terminate",
            max_price=max_price,
        ),
    )


def aws_program(request: ClusterRequest,
                ssh_cidr_lookup: Callable[[], str] | None = None) -> StackProgram:
    """The program for ``request`` on AWS; the plan (offer, market, disk, zones) is checked
    now."""
    plan = common.plan_cluster(request)
    ami = ami_query(plan.offer)
    common.check_disk(plan, ami.min_disk_gb, ami.name)
    usable_zones(plan.offer)  # a type no zone of the region offers fails before any stack
    provider_config = request.spec.provider

    def declare(stored: Mapping[str, str], record: Recorder) -> dict[str, Any]:
        decided = decisions.decide(request, stored)
        record.identity(decided)
        ssh_cidr = pins.pinned_ssh_cidr(stored, getattr(provider_config, "ssh_cidr", None),
                                        ssh_cidr_lookup)
        use_default_vpc = bool(getattr(provider_config, "use_default_vpc", True))
        exports = declare_cluster(decided.plan(request), decided, record, ssh_cidr,
                                  use_default_vpc, stored.get(pins.AWS_ACCOUNT_ID),
                                  request.node_zones)
        return {**exports, **volume_exports(request)}

    return StackProgram("aws", declare)


def declare_cluster(plan: ClusterPlan, decided: Decided, record: Recorder, ssh_cidr: str,
                    use_default_vpc: bool, account_id: str | None = None,
                    moved: Mapping[int, str] | None = None) -> dict[str, Any]:
    """Declare every resource of the cluster and return the outputs to export.

    ``account_id``: the only account the provider may act in (stacks pin it at creation), so
    credentials of another account fail instead of reading every resource as gone. ``moved``:
    nodes a capacity refusal moved to a sibling zone (``ClusterRequest.node_zones``).
    """
    tags = dict(plan.tags)
    provider = aws.Provider(
        "aws", region=plan.offer.region, default_tags=aws.ProviderDefaultTagsArgs(tags=tags),
        allowed_account_ids=[account_id] if account_id else None)
    opts = pulumi.ResourceOptions(provider=provider)
    invoke = pulumi.InvokeOptions(provider=provider)
    credentials = StackCredentials("credentials", stack=plan.stack_name)

    usable = usable_zones(plan.offer)
    pool_zone = decided.zone or usable[0]
    zones = node_zones(plan, pool_zone, {i: pin.zone for i, pin in decided.nodes.items()},
                       moved or {})
    network = cluster_network(plan, use_default_vpc, opts, invoke,
                              network_zones(plan, use_default_vpc, pool_zone, usable, zones))
    record.record(pins.ZONE, pool_zone)
    efa = uses_efa(plan)
    group = _security_group(plan, network, common.ingress_rules(ssh_cidr), opts, efa)
    efa_attach = _efa_attachment(plan, network, group, opts) if efa else None
    key = aws.ec2.KeyPair(
        "ssh-key", key_name_prefix=f"{plan.stack_name}-", public_key=credentials.ssh_public_key,
        tags=tags, opts=opts,
    )
    placement = aws.ec2.PlacementGroup(
        "placement", strategy="cluster", tags=tags, opts=opts,
    ) if plan.placement else None
    image = decided.image or newest_ami(ami_query(plan.offer), invoke)
    record.record(pins.IMAGE, image)
    images = {index: decided.nodes[index].image if index in decided.nodes else image
              for index in range(plan.node_count)}
    record.nodes(images, zones)
    profile = volume_instance_profile(plan, opts)
    nodes = []
    for index in range(plan.node_count):
        host_key, user_data = node_boot(plan, credentials, index)
        instance = aws.ec2.Instance(
            f"node-{index}",
            ami=images[index],
            instance_type=plan.offer.machine_type,
            key_name=key.key_name,
            placement_group=placement.name if placement else None,
            # The TTL watchdog powers the node off; AWS must then delete it, not keep it stopped.
            instance_initiated_shutdown_behavior="terminate",
            instance_market_options=market_options(plan, index),
            root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
                volume_size=plan.disk_gb, volume_type="gp3", delete_on_termination=True,
                encrypted=True, tags=tags,
            ),
            # IMDSv2 only, one hop: containers on the node cannot read the user data (host key).
            metadata_options=aws.ec2.InstanceMetadataOptionsArgs(
                http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=1,
            ),
            user_data=user_data,
            # Only with bucket volumes: otherwise the node holds no AWS credentials at all.
            iam_instance_profile=profile.name if profile else None,
            tags={**tags, "Name": f"{plan.stack_name}-node-{index}", "skyward-node": str(index)},
            # Nodes of stacks that predate the stored image were created with whatever AMI was
            # newest then: the one declared now must not replace them.
            opts=pulumi.ResourceOptions(provider=provider, ignore_changes=["ami"]),
            **(efa_attach or _plain_attachment(network.subnets[zones[index]], group)),
        )
        nodes.append(common.node_output(index, instance.private_ip, instance.public_ip,
                                        host_key.public_key))
    return cluster_exports(plan.stack_name, plan.collections, credentials, nodes)


def newest_ami(ami: AmiQuery, invoke: pulumi.InvokeOptions) -> pulumi.Output[str]:
    """The id of the newest AMI ``ami`` describes in the provider's region."""
    return aws.ec2.get_ami_output(
        most_recent=True, owners=list(ami.owners),
        filters=[aws.ec2.GetAmiFilterArgs(name=name, values=[value]) for name, value in (
            ("name", ami.name), ("architecture", ami.architecture),
            ("root-device-type", "ebs"), ("virtualization-type", "hvm"))],
        opts=invoke,
    ).id


def _plain_attachment(subnet_id: pulumi.Output[str],
                      group: aws.ec2.SecurityGroup) -> dict[str, Any]:
    """A node's subnet (its zone's), group and public address, given to the instance itself."""
    return {"subnet_id": subnet_id, "vpc_security_group_ids": [group.id],
            "associate_public_ip_address": True}


def _efa_attachment(plan: ClusterPlan, network: Network, group: aws.ec2.SecurityGroup,
                    opts: pulumi.ResourceOptions) -> dict[str, Any]:
    """The same, through the EFA launch template (AWS refuses both on one launch)."""
    template = efa_launch_template(plan, network, group.id, opts)
    return {"launch_template": aws.ec2.InstanceLaunchTemplateArgs(id=template.id)}


def _security_group(plan: ClusterPlan, network: Network, rules: tuple[IngressRule, ...],
                    opts: pulumi.ResourceOptions, efa: bool = False) -> aws.ec2.SecurityGroup:
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
    if efa:  # EFA's OS-bypass traffic is not IP: only a rule naming the group itself passes it
        aws.vpc.SecurityGroupEgressRule(
            "egress-cluster", security_group_id=group.id, ip_protocol="-1",
            referenced_security_group_id=group.id,
            description="all traffic to the nodes of the cluster (EFA)", tags=tags, opts=opts,
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


# -- volumes -----------------------------------------------------------------------------------

EC2_TRUST = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                   "Action": "sts:AssumeRole"}],
}
#: What s3fs needs to change objects of a read-write volume (multipart uploads included).
S3_WRITE_ACTIONS = ["s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                    "s3:ListMultipartUploadParts"]


def _objects_arn(volume: Volume) -> str:
    return f"arn:aws:s3:::{volume.bucket}/{volume.prefix + '/' if volume.prefix else ''}*"


def s3_volume_policy(volumes: Sequence[Volume]) -> dict[str, Any]:
    """The nodes' IAM policy for their bucket volumes: list each bucket, read each volume's
    objects, and write only those of read-write volumes (only under the volume's prefix)."""
    buckets = sorted({v.bucket for v in volumes})
    statements: list[dict[str, Any]] = [
        # Listing is granted bucket-wide: s3fs lists parent "directories" of the prefix too.
        {"Sid": "ListVolumeBuckets", "Effect": "Allow",
         "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
         "Resource": [f"arn:aws:s3:::{b}" for b in buckets]},
        # The prefix's own key too: s3fs looks up the mount root as an object before listing.
        {"Sid": "ReadVolumeObjects", "Effect": "Allow", "Action": ["s3:GetObject"],
         "Resource": sorted({_objects_arn(v) for v in volumes}
                            | {f"arn:aws:s3:::{v.bucket}/{v.prefix}" for v in volumes if v.prefix})},
    ]
    writable = sorted({_objects_arn(v) for v in volumes if not v.read_only})
    if writable:
        statements.append({"Sid": "WriteVolumeObjects", "Effect": "Allow",
                           "Action": S3_WRITE_ACTIONS, "Resource": writable})
    return {"Version": "2012-10-17", "Statement": statements}


def volume_instance_profile(plan: ClusterPlan,
                            opts: pulumi.ResourceOptions) -> aws.iam.InstanceProfile | None:
    """A role nodes assume for their bucket volumes (s3fs ``iam_role=auto``), its policy and
    the instance profile that carries it; None when no volume uses the node's identity."""
    if not plan.identity_volumes:
        return None
    tags = dict(plan.tags)
    prefix = f"{plan.stack_name[:37]}-"  # IAM allows name prefixes of at most 38 characters
    role = aws.iam.Role(
        "volumes-role", name_prefix=prefix, assume_role_policy=json.dumps(EC2_TRUST),
        description=f"skyward_iac {plan.stack_name}: nodes mount their bucket volumes",
        tags=tags, opts=opts,
    )
    aws.iam.RolePolicy("volumes-policy", role=role.id,
                       policy=json.dumps(s3_volume_policy(plan.identity_volumes)), opts=opts)
    return aws.iam.InstanceProfile("volumes-profile", name_prefix=prefix, role=role.name,
                                   tags=tags, opts=opts)
