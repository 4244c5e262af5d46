"""Policy shared by the cloud programs: the cluster plan, firewall rules, tags and exports.

Pure functions over a ``ClusterRequest``; the AWS and GCP modules only translate their results
into resources, so the rules (who may reach SSH, that etcd never faces the internet, what every
resource is tagged with) are decided once and tested without a cloud.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import pulumi

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.volumes import Volume, check_volumes, mount_kind
from skyward_iac.infra.capacity.offers import Market, Offer, market_for, select
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.programs.cloud_init import SSH_USER, WORKDIR
from skyward_iac.infra.stacks.tags import stack_tags
from skyward_iac.node.data_port import CLOUD_PORT

SSH_PORT = 22
ETCD_PORTS = (2379, 2380)
#: Root disk when the spec does not say: images with GPU drivers are large, and a container
#: image (``container_image``) is pulled and unpacked beside the OS.
DEFAULT_DISK_GB = {"cpu": 30, "container": 60, "accelerated": 100}
CALLER_IP_URL = "https://checkip.amazonaws.com"
SELF = "self"


@dataclass(frozen=True, slots=True)
class ClusterPlan:
    """Everything a cloud program declares, decided before any resource exists."""

    stack_name: str
    offer: Offer
    market: Market
    node_count: int
    disk_gb: int
    ttl: int
    max_lifetime: int | None
    spot_max_price: float | None
    placement: bool
    tags: Mapping[str, str]
    collections: bool = True
    #: Volumes the nodes reach with their own cloud identity (AWS instance profile, GCP
    #: service account); the program grants that identity access to exactly these buckets.
    identity_volumes: tuple[Volume, ...] = ()
    #: Nodes moved on demand after the cloud refused their spot launch (spot plans only).
    on_demand_nodes: frozenset[int] = frozenset()

    def node_market(self, index: int) -> Market:
        """The market node ``index`` runs on."""
        return "on-demand" if index in self.on_demand_nodes else self.market


def plan_cluster(request: ClusterRequest) -> ClusterPlan:
    """Resolve ``request`` into a plan: offer, market, disk, placement and tags.

    Raises ``ConfigError`` when no offer serves the spec, before any resource exists.
    """
    spec = request.spec
    offer = request.offer or select([spec]).offer
    if offer.provider != spec.provider.kind:
        raise ConfigError(f"the request's offer is a {offer.provider} offer but the spec's "
                          f"provider is {spec.provider.kind}")
    market = request.market or market_for(spec.allocation, offer)
    if market is None or offer.price(market) is None:
        raise ConfigError(
            f"{offer.instance_type} in {offer.region} has no {request.market or spec.allocation} "
            "market; choose another allocation or offer"
        )
    if request.node_count < 1:
        raise ConfigError(f"a cluster needs at least one node, got {request.node_count}")
    if request.max_lifetime is not None and request.max_lifetime <= 0:
        raise ConfigError(f"max_lifetime must be a positive number of seconds, "
                          f"got {request.max_lifetime}")
    accelerated = offer.accelerator is not None
    disk_gb = spec.disk_gb or DEFAULT_DISK_GB[
        "accelerated" if accelerated else "container" if spec.provider.container_image else "cpu"]
    return ClusterPlan(
        stack_name=request.stack_name, offer=offer, market=market,
        node_count=request.node_count, disk_gb=disk_gb, ttl=spec.ttl,
        collections=request.collections,
        max_lifetime=request.max_lifetime,
        # Never pay more than the user's cap, even if the spot price moves after selection.
        spot_max_price=spec.max_hourly_cost if market == "spot" else None,
        # Collective GPU traffic wants nodes close together; a pool that can never have two
        # nodes has no neighbours. Decided from the pool's maximum as the stack stored it
        # (decisions.py), never today's count: turning placement on at a resize would recreate
        # the running head node, so a fixed pool created with one node keeps none.
        placement=accelerated and (request.max_nodes or request.node_count) > 1,
        tags=resource_tags(request),
        identity_volumes=identity_volumes(request),
        on_demand_nodes=request.on_demand_nodes if market == "spot" else frozenset(),
    )


def request_volumes(request: ClusterRequest) -> tuple[Volume, ...]:
    """The request's volumes (``Spec.volumes``; none on a Spec that predates the field)."""
    return tuple(getattr(request.spec, "volumes", ()))


def identity_volumes(request: ClusterRequest) -> tuple[Volume, ...]:
    """The volumes nodes mount as themselves: every one whose ``mount_kind`` is the provider's
    identity. Raises ``ConfigError`` for volumes nodes could not mount at all."""
    provider = request.spec.provider.kind
    volumes = request_volumes(request)
    check_volumes(volumes, provider)
    identity = request.spec.provider.identity_mount
    return tuple(v for v in volumes if identity is not None and identity == mount_kind(v, provider))


def check_disk(plan: ClusterPlan, image_min_gb: int, image: str) -> None:
    """A root disk smaller than the image's snapshot fails at launch; fail before instead."""
    if plan.disk_gb < image_min_gb:
        raise ConfigError(
            f"disk_gb={plan.disk_gb} is smaller than the {image} image ({image_min_gb} GB); "
            f"use disk_gb >= {image_min_gb}"
        )


def resource_tags(request: ClusterRequest) -> dict[str, str]:
    """Tags on every resource: the user's (``Options.tags``), then stack, owner and
    expires_at (as on the stack itself), which the user's cannot override."""
    created = request.created_at or datetime.now(UTC)
    stack = stack_tags(request.spec, request.node_count, now=created)
    return {
        **request.tags,
        "skyward-stack": request.stack_name,
        "skyward-owner": stack["owner"],
        "skyward-expires-at": stack["expires_at"],
        "managed-by": "skyward_iac",
    }


def gcp_labels(tags: Mapping[str, str]) -> dict[str, str]:
    """``tags`` as GCP labels: lowercase letters, digits, ``_`` and ``-``, at most 63 chars."""
    return {_label(key): _label(value) for key, value in tags.items()}


def _label(text: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "_", text.lower())[:63]


def gcp_name(stack_name: str, suffix: str, limit: int = 63) -> str:
    """A GCP resource name for the stack (RFC 1035: lowercase, starts with a letter, <= 63)."""
    base = re.sub(r"[^a-z0-9-]", "-", stack_name.lower()).strip("-")
    base = re.sub(r"^[^a-z]+", "", base) or "skyward"
    return f"{base[: limit - len(suffix) - 1].rstrip('-')}-{suffix}"


# -- GPU drivers ------------------------------------------------------------------------------

#: NVIDIA GPUs older than Turing, by generation: NVIDIA's open kernel modules (the "OSS" driver
#: images) run Turing and newer only; these need the proprietary driver, and Kepler a driver
#: older than 550.
PRE_TURING = {"K80": "kepler", "K520": "kepler", "M60": "maxwell", "P100": "pascal",
              "P4": "pascal", "V100": "volta"}
#: What each kind of driver an image ships can run.
DRIVER_RUNS = {
    "nvidia-open": lambda gpu: gpu not in PRE_TURING,
    "nvidia-proprietary": lambda gpu: PRE_TURING.get(gpu) != "kepler",
}


def nvidia_driver_for(accelerator: str) -> str:
    """The kind of NVIDIA driver an image must ship for ``accelerator``."""
    return "nvidia-proprietary" if accelerator in PRE_TURING else "nvidia-open"


# -- firewall policy ---------------------------------------------------------------------------

Protocol = Literal["tcp", "all"]


#: What EC2 accepts in a security group rule's description (the API's constraint on
#: ``IpRange``/``UserIdGroupPair`` descriptions: no apostrophe, for one).
AWS_RULE_DESCRIPTION = re.compile(r"[a-zA-Z0-9 ._\-:/()#,@\[\]+=&;{}!$*]{0,255}")


@dataclass(frozen=True, slots=True)
class IngressRule:
    """Traffic allowed in: ``source`` is a CIDR or ``SELF`` (the cluster's own nodes).
    ``description`` must match ``AWS_RULE_DESCRIPTION`` (it becomes the EC2 rule's)."""

    name: str
    protocol: Protocol
    ports: tuple[int, int] | None  # inclusive range; None = every port
    source: str
    description: str


def ingress_rules(ssh_cidr: str) -> tuple[IngressRule, ...]:
    """The cluster's inbound rules: SSH and the agents' data port (TCP with mutual TLS,
    node/data_port.py ``CLOUD_PORT``) from ``ssh_cidr`` alone, everything between its own
    nodes.

    etcd (2379/2380), the agent's own port and every other port are reachable only from
    inside the cluster; the client reaches them through SSH tunnels.
    """
    rules = (
        IngressRule("ssh", "tcp", (SSH_PORT, SSH_PORT), ssh_cidr, "SSH from the client"),
        # Where SSH reaches and nowhere else: a client that may not log in has no business
        # with the agents either (the port asks for the stack's certificate besides).
        IngressRule("data", "tcp", (CLOUD_PORT, CLOUD_PORT), ssh_cidr,
                    "agent data port (mutual TLS) from the client"),
        IngressRule("cluster", "all", None, SELF, "all traffic between the nodes of the cluster"),
    )
    check_rules(rules)
    return rules


def check_rules(rules: Sequence[IngressRule]) -> None:
    """Refuse any rule that would open an etcd port to an address range."""
    for rule in rules:
        if rule.source == SELF:
            continue
        low, high = rule.ports or (0, 65535)
        exposed = [p for p in ETCD_PORTS if low <= p <= high]
        if exposed:
            raise ConfigError(
                f"firewall rule {rule.name!r} would open etcd port(s) {exposed} to {rule.source}; "
                "etcd is reachable only from inside the cluster"
            )


def caller_cidr(timeout: float = 5.0) -> str:
    """The caller's public IPv4 address as a /32, asked of ``CALLER_IP_URL``."""
    try:
        with urllib.request.urlopen(CALLER_IP_URL, timeout=timeout) as response:  # noqa: S310
            address = ipaddress.ip_address(response.read().decode().strip())
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"could not learn this machine's public IP from {CALLER_IP_URL} ({exc}); set "
            "ssh_cidr on the provider, e.g. sky.AWS(ssh_cidr='203.0.113.7/32')"
        ) from None
    return f"{address}/{address.max_prefixlen}"


def resolve_ssh_cidr(configured: str | None, lookup: Callable[[], str] | None = None) -> str:
    """The CIDR allowed to reach SSH: the configured one, else the caller's public /32."""
    if configured is None:
        return (lookup or caller_cidr)()
    try:
        return str(ipaddress.ip_network(configured, strict=False))
    except ValueError:
        raise ConfigError(
            f"ssh_cidr must be a CIDR like '203.0.113.0/24', got {configured!r}"
        ) from None


# -- outputs -----------------------------------------------------------------------------------


def node_output(index: int, private_address: pulumi.Input[str], public_address: pulumi.Input[str],
                host_key: pulumi.Input[str]) -> dict[str, Any]:
    """One entry of the ``nodes`` output, the same shape as every other provider's."""
    return {
        "index": index,
        "private_address": private_address,
        "public_address": public_address,
        "ssh_port": SSH_PORT,
        "ssh_user": SSH_USER,
        "host_key": host_key,
        "workdir": WORKDIR,
    }


def export_cluster(outputs: Mapping[str, Any]) -> None:
    """Export a program's outputs (``nodes``, ``ssh_private_key``, ``agent_token``)."""
    for name, value in outputs.items():
        pulumi.export(name, value)
