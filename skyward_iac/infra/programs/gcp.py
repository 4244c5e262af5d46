"""The GCP provider's stack: a network of its own, firewalls, placement and Compute instances.

Every resource goes through one explicit ``gcp.Provider`` (project, region and zone pinned) and
carries the cluster labels. Spot nodes use ``provisioning_model="SPOT"`` with termination action
DELETE; ``max_run_duration`` (when the request sets ``max_lifetime``) makes GCP delete a node at
that age even if its watchdog never ran, which the in-node dead-man switch cannot guarantee.
A3 nodes get a gVNIC network interface, which their machine family requires. The boot image
is a specific image (its self link, the family's newest when the stack's first run looked it
up), never the family itself: terraform-provider-google's ``DiskImageDiffSuppress`` cannot
match Canonical's accelerator family to its images, and a family would give nodes created later
another image. The image, the pool's zone, each node's zone (the pool's, or for a pool without
a compact placement policy the sibling zone a capacity refusal moved a new node to: the
subnetwork spans the region) and the request's tags and lifetime are decided once per stack
(``decisions.py``). What the nodes run as is ``gcp_identity.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_gcp as gcp

from skyward_iac.api.accelerators import vendor_of
from skyward_iac.api.errors import ConfigError
from skyward_iac.infra.capacity.offers import Offer
from skyward_iac.infra.capacity.zones import declared_zones
from skyward_iac.infra.identity.credentials import StackCredentials
from skyward_iac.infra.programs import ClusterRequest, common, decisions, pins
from skyward_iac.infra.programs.cloud_init import SSH_USER
from skyward_iac.infra.programs.common import SELF, ClusterPlan, IngressRule
from skyward_iac.infra.programs.decisions import Decided, Recorder, StackProgram
from skyward_iac.infra.programs.exports import cluster_exports, volume_exports
from skyward_iac.infra.programs.gcp_identity import (
    AUTO,
    NodeAccount,
    NodeIdentity,
    declare_identity,
    node_identity,
    program_fallback,
)
from skyward_iac.infra.programs.host_key import node_boot

SUBNET_CIDR = "10.42.0.0/20"
#: Machine families that accept a compact placement policy (N1 with attached GPUs does not).
COMPACT_PLACEMENT_FAMILIES = ("a2", "a3", "a4", "g2")
#: Machine families whose network interface must be gVNIC (A3: H100/H200 with GPUDirect).
GVNIC_FAMILIES = ("a3",)


@dataclass(frozen=True, slots=True)
class BootImage:
    """A boot image family (``projects/P/global/images/family/F``; a stack uses its newest
    image at creation) and its size."""

    family: str
    min_disk_gb: int
    #: The GPU driver the image ships (``common.DRIVER_RUNS``), None without one.
    driver: str | None = None

    def newest(self, invoke: pulumi.InvokeOptions) -> pulumi.Output[str]:
        """The self link of the family's newest image (``compute.getImage``)."""
        project, family = self.family.removeprefix("projects/").split(
            "/global/images/family/")
        return gcp.compute.get_image_output(family=family, project=project,
                                            opts=invoke).self_link


def boot_image(offer: Offer) -> BootImage:
    """The image family for an offer's architecture and accelerator vendor."""
    if offer.accelerator and vendor_of(offer.accelerator) == "nvidia":
        # Canonical's accelerator image: the proprietary 550 server driver (Maxwell and newer,
        # so V100 as well as the Turing+ GPUs).
        return BootImage("projects/ubuntu-os-accelerator-images/global/images/family/"
                         "ubuntu-accelerator-2204-amd64-with-nvidia-550", 50, "nvidia-proprietary")
    # 22.04 like the GPU image: its sshd starts only after cloud-init installed the host key.
    family = "ubuntu-2204-lts-arm64" if offer.architecture == "arm64" else "ubuntu-2204-lts"
    return BootImage(f"projects/ubuntu-os-cloud/global/images/family/{family}", 10)


def zone_for(offer: Offer, configured: str | None) -> str:
    """The zone nodes go to: the configured one, else the first that offers the type."""
    if configured:
        return configured
    if not offer.zones:
        raise ConfigError(f"the catalog lists no zone for {offer.instance_type} in "
                          f"{offer.region}; set sky.GCP(zone=...)")
    return offer.zones[0]


def scheduling(plan: ClusterPlan, node: int) -> gcp.compute.InstanceSchedulingArgs:
    """Node ``node``'s scheduling block for its market, accelerator and lifetime cap."""
    if plan.node_market(node) == "spot":
        block: dict[str, Any] = {
            "provisioning_model": "SPOT", "preemptible": True, "automatic_restart": False,
            "instance_termination_action": "DELETE", "on_host_maintenance": "TERMINATE",
        }
    else:
        # VMs with GPUs cannot live-migrate.
        block = {
            "provisioning_model": "STANDARD", "preemptible": False, "automatic_restart": True,
            "on_host_maintenance": "TERMINATE" if plan.offer.accelerator else "MIGRATE",
        }
    if plan.max_lifetime:
        block["max_run_duration"] = gcp.compute.InstanceSchedulingMaxRunDurationArgs(
            seconds=plan.max_lifetime)
        block["instance_termination_action"] = "DELETE"
    # Typed: a misspelled field is a TypeError here, not an input the mocks would accept.
    return gcp.compute.InstanceSchedulingArgs(**block)


def compact_placement(plan: ClusterPlan) -> bool:
    """Whether the nodes get a compact placement policy (multi-node GPU pools that support it)."""
    return plan.placement and plan.offer.machine_type.split("-")[0] in COMPACT_PLACEMENT_FAMILIES


def nic_type(plan: ClusterPlan) -> str | None:
    """The nodes' NIC type: ``GVNIC`` where the machine family requires it, else the default
    (None: GCP picks VirtIO, as for every pool before). Its image must support gVNIC, as
    Ubuntu's accelerator images do."""
    return "GVNIC" if plan.offer.machine_type.split("-")[0] in GVNIC_FAMILIES else None


def firewall_args(rule: IngressRule, tag: str) -> dict[str, Any]:
    """A ``compute.Firewall``'s arguments for one ingress rule (``SELF`` = the node tag)."""
    ports = None
    if rule.ports is not None:
        low, high = rule.ports
        ports = [str(low) if low == high else f"{low}-{high}"]
    allow = gcp.compute.FirewallAllowArgs(protocol=rule.protocol, ports=ports)
    source = {"source_tags": [tag]} if rule.source == SELF else {"source_ranges": [rule.source]}
    return {"direction": "INGRESS", "allows": [allow], "target_tags": [tag],
            "description": rule.description, **source}


def gcp_program(request: ClusterRequest,
                ssh_cidr_lookup: Callable[[], str] | None = None) -> StackProgram:
    """The program for ``request`` on GCP; the plan (offer, market, disk, zone) is checked now."""
    plan = common.plan_cluster(request)
    image = boot_image(plan.offer)
    common.check_disk(plan, image.min_disk_gb, image.family.rsplit("/", 1)[-1])
    provider_config = request.spec.provider
    # A row that lists no zone fails now, before any stack exists; so do volumes that would
    # have no account to mount them as.
    zone_for(plan.offer, request.zone or getattr(provider_config, "zone", None))
    account_setting = getattr(provider_config, "service_account", AUTO)
    node_identity(plan, account_setting)
    project = getattr(provider_config, "project", None)
    identities: list[NodeIdentity] = []

    def declare(stored: Mapping[str, str], record: Recorder) -> dict[str, Any]:
        decided = decisions.decide(request, stored)
        record.identity(decided)
        zone = decided.zone or zone_for(decided.offer, getattr(provider_config, "zone", None))
        ssh_cidr = pins.pinned_ssh_cidr(stored, getattr(provider_config, "ssh_cidr", None),
                                        ssh_cidr_lookup)
        cluster = decided.plan(request)
        identities.append(node_identity(cluster, account_setting, stored.get(pins.IDENTITY)))
        # The project stored at creation, so the provider never falls back to the caller's.
        exports = declare_cluster(cluster, decided, record, zone,
                                  stored.get(pins.GCP_PROJECT) or project, ssh_cidr,
                                  identities[-1], request.node_zones)
        return {**exports, **volume_exports(request)}

    def fallback(errors: Mapping[str, str]) -> decisions.Fallback | None:
        """What the last run may go without (``gcp_identity``): GCP refused its identity."""
        return program_fallback(request.stack_name, identities[-1])(errors) if identities \
            else None

    return StackProgram("gcp", declare, fallback)


def declare_cluster(plan: ClusterPlan, decided: Decided, record: Recorder, zone: str,
                    project: str | None, ssh_cidr: str, identity: NodeIdentity,
                    moved: Mapping[int, str] | None = None) -> dict[str, Any]:
    """Declare every resource of the cluster and return the outputs to export. ``zone`` is
    the pool's; ``moved``: new nodes a capacity refusal sent to a sibling zone."""
    labels = common.gcp_labels(plan.tags)
    region = plan.offer.region
    provider = gcp.Provider("gcp", project=project, region=region, zone=zone,
                            default_labels=labels)
    # Names are fixed (readable in the console); a replacement must free the name first.
    opts = pulumi.ResourceOptions(provider=provider, delete_before_replace=True)

    def name(suffix: str) -> str:
        return common.gcp_name(plan.stack_name, suffix)

    tag = name("node")
    credentials = StackCredentials("credentials", stack=plan.stack_name)

    network = gcp.compute.Network("network", name=name("net"), auto_create_subnetworks=False,
                                  description=f"skyward_iac cluster {plan.stack_name}", opts=opts)
    subnet = gcp.compute.Subnetwork("subnet", name=name("subnet"), network=network.id,
                                    region=region, ip_cidr_range=SUBNET_CIDR, opts=opts)
    for rule in common.ingress_rules(ssh_cidr):
        gcp.compute.Firewall(f"firewall-{rule.name}", name=name(rule.name), network=network.id,
                             opts=opts, **firewall_args(rule, tag))
    placement = gcp.compute.ResourcePolicy(
        "placement", name=name("placement"), region=region,
        group_placement_policy=gcp.compute.ResourcePolicyGroupPlacementPolicyArgs(
            collocation="COLLOCATED"),
        opts=opts,
    ) if compact_placement(plan) else None

    image = decided.image or boot_image(plan.offer).newest(pulumi.InvokeOptions(
        provider=provider))
    record.record(pins.ZONE, zone)
    record.record(pins.IMAGE, image)
    pinned = {index: decided.nodes.get(index) for index in range(plan.node_count)}
    images = {i: pin.image if pin else image for i, pin in pinned.items()}
    # Each node stays in the zone it was created in; a new one goes to the pool's zone, or to
    # the sibling zone a refusal moved it to (the subnetwork spans the region; a compact
    # placement policy holds the pool in one zone).
    zones = declared_zones(plan.node_count, zone, {i: p.zone for i, p in decided.nodes.items()},
                           moved or {}, together=compact_placement(plan))
    record.nodes(images, zones)
    guest = plan.offer.guest_accelerator
    account: NodeAccount | None = declare_identity(plan, identity, opts)
    nodes = []
    for index in range(plan.node_count):
        # The fire path is in the user data of every node with an account and a ttl; where
        # GCP refused the grant, its DELETE fails and the power-off follows.
        host_key, user_data = node_boot(plan, credentials, index, self_delete=account is not None
                                        and plan.ttl > 0)
        instance = gcp.compute.Instance(
            f"node-{index}",
            name=name(f"node-{index}"),
            zone=zones[index],
            machine_type=plan.offer.machine_type,
            boot_disk=gcp.compute.InstanceBootDiskArgs(
                auto_delete=True,
                initialize_params=gcp.compute.InstanceBootDiskInitializeParamsArgs(
                    image=images[index], size=plan.disk_gb,
                    type=plan.offer.boot_disk_type or "pd-balanced", labels=labels,
                ),
            ),
            # A2/A3/G2 types come with their GPUs; N1 rows attach them explicitly.
            guest_accelerators=[gcp.compute.InstanceGuestAcceleratorArgs(
                type=guest[0], count=guest[1])] if guest else None,
            network_interfaces=[gcp.compute.InstanceNetworkInterfaceArgs(
                subnetwork=subnet.id, nic_type=nic_type(plan),
                access_configs=[gcp.compute.InstanceNetworkInterfaceAccessConfigArgs()],
            )],
            scheduling=scheduling(plan, index),
            resource_policies=placement.self_link if placement else None,
            metadata={
                "ssh-keys": credentials.ssh_public_key.apply(lambda key: f"{SSH_USER}:{key}"),
                "block-project-ssh-keys": "TRUE",
                "enable-oslogin": "FALSE",  # OS Login would ignore the stack's key
                "user-data": user_data,
            },
            tags=[tag],
            labels={**labels, "skyward-node": str(index)},
            # gcp_identity: delete on this instance alone (the watchdog's fire path) and the
            # volumes' buckets; none without a ttl or volumes, or where GCP refused one.
            service_account=account.block if account is not None else None,
            # Nodes of stacks that predate the stored image were created from a family: the
            # image declared now must not replace them.
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
                ignore_changes=["bootDisk.initializeParams.image"])),
        )
        if account is not None:
            account.bind_self_delete(index, instance, zones[index], opts)
        interface = instance.network_interfaces[0]
        nodes.append(common.node_output(
            index, interface.network_ip, interface.access_configs[0].nat_ip, host_key.public_key,
        ))
    return cluster_exports(plan.stack_name, plan.collections, credentials, nodes)
