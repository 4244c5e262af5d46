"""What a reviewer reads of each resource a cloud program declares: its key inputs.

Pure functions over a resource's declared inputs as the Pulumi mocks receive them (camelCase,
numbers as floats). Only chosen fields are read -- instance type, market, image, zone, disk,
the firewall's sources and ports, the IAM grants -- never boot data or keys: a node's user data
carries its SSH host key. Any secret-marked value among the chosen fields reads ``[secret]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pulumi.runtime.rpc import _special_secret_sig, _special_sig_key

#: The nodes: one per instance, on each cloud.
NODE_TYPES = frozenset({"aws:ec2/instance:Instance", "gcp:compute/instance:Instance"})
SECRET = "[secret]"

Inputs = Mapping[str, Any]


def key_inputs(typ: str, inputs: Inputs, stack_zone: str | None = None) -> dict[str, Any]:
    """The inputs of a ``typ`` resource a reviewer reads, by readable name, in a fixed order;
    none for a type not listed (its type and name say what it is). ``stack_zone``: the zone an
    AWS node runs in (it is the subnet's, not an input of the instance)."""
    if typ == "aws:ec2/instance:Instance":
        found = _aws_instance(inputs, stack_zone)
    elif typ == "gcp:compute/instance:Instance":
        found = _gcp_instance(inputs)
    elif (fields := FIELDS.get(typ)) is not None:
        found = {label: read(inputs) for label, read in fields}
    else:
        found = {}
    return {key: readable(value) for key, value in found.items()
            if value is not None and value != []}


def readable(value: Any) -> Any:
    """``value`` for a reviewer: secrets hidden, whole floats as ints (the mocks send every
    number as a float)."""
    if isinstance(value, Mapping):
        if value.get(_special_sig_key) == _special_secret_sig:
            return SECRET
        return {str(k): readable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [readable(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _path(*keys: str) -> Callable[[Inputs], Any]:
    def read(inputs: Inputs) -> Any:
        value: Any = inputs
        for key in keys:
            value = value.get(key) if isinstance(value, Mapping) else None
        return value
    return read


def _aws_instance(inputs: Inputs, zone: str | None) -> dict[str, Any]:
    market = inputs.get("instanceMarketOptions") or {}
    disk = inputs.get("rootBlockDevice") or {}
    return {
        "instance_type": inputs.get("instanceType"),
        "market": market.get("marketType") or "on-demand",
        "max_price_usd": (market.get("spotOptions") or {}).get("maxPrice"),
        "image": inputs.get("ami"),
        "zone": inputs.get("availabilityZone") or zone,
        "disk_gb": disk.get("volumeSize"),
        "disk_type": disk.get("volumeType"),
        "disk_encrypted": disk.get("encrypted"),
        "placement_group": inputs.get("placementGroup"),
        "efa": True if inputs.get("launchTemplate") else None,
        "instance_profile": inputs.get("iamInstanceProfile"),
    }


def _gcp_instance(inputs: Inputs) -> dict[str, Any]:
    boot = (inputs.get("bootDisk") or {}).get("initializeParams") or {}
    scheduling = inputs.get("scheduling") or {}
    interfaces = inputs.get("networkInterfaces") or [{}]
    return {
        "instance_type": inputs.get("machineType"),
        "market": "spot" if scheduling.get("provisioningModel") == "SPOT" else "on-demand",
        "image": boot.get("image"),
        "zone": inputs.get("zone"),
        "disk_gb": boot.get("size"),
        "disk_type": boot.get("type"),
        "accelerators": [f"{readable(g.get('count'))}x {g.get('type')}"
                         for g in inputs.get("guestAccelerators") or []],
        "max_run_seconds": (scheduling.get("maxRunDuration") or {}).get("seconds"),
        "nic": interfaces[0].get("nicType"),
        "placement_policy": inputs.get("resourcePolicies"),
        "service_account_scopes": (inputs.get("serviceAccount") or {}).get("scopes"),
    }


def _ports(inputs: Inputs) -> str | None:
    low, high = inputs.get("fromPort"), inputs.get("toPort")
    if low is None:
        return None
    return f"{low:g}" if low == high else f"{low:g}-{high:g}"


def _aws_rule(inputs: Inputs) -> str | None:
    if inputs.get("referencedSecurityGroupId"):
        return "the cluster's own nodes"
    return inputs.get("cidrIpv4") or inputs.get("cidrIpv6")


_RULE: tuple[tuple[str, Callable[[Inputs], Any]], ...] = (
    ("protocol", lambda i: "all" if i.get("ipProtocol") == "-1" else i.get("ipProtocol")),
    ("ports", _ports),
    ("peer", _aws_rule),
)
#: The chosen fields of every other type (label, reader), in the order they are shown.
FIELDS: dict[str, tuple[tuple[str, Callable[[Inputs], Any]], ...]] = {
    "pulumi:providers:aws": (("region", _path("region")),
                             ("allowed_accounts", _path("allowedAccountIds"))),
    "pulumi:providers:gcp": (("project", _path("project")), ("region", _path("region")),
                             ("zone", _path("zone"))),
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": _RULE,
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": _RULE,
    "aws:ec2/placementGroup:PlacementGroup": (("strategy", _path("strategy")),),
    "aws:ec2/vpc:Vpc": (("cidr", _path("cidrBlock")),),
    "aws:ec2/subnet:Subnet": (("cidr", _path("cidrBlock")),
                              ("zone", _path("availabilityZone"))),
    "aws:ec2/launchTemplate:LaunchTemplate": (
        ("interface", lambda i: [n.get("interfaceType") for n in i.get("networkInterfaces")
                                 or []]),),
    "aws:iam/rolePolicy:RolePolicy": (("policy", _path("policy")),),
    "gcp:compute/subnetwork:Subnetwork": (("cidr", _path("ipCidrRange")),
                                          ("region", _path("region"))),
    "gcp:compute/firewall:Firewall": (
        ("direction", _path("direction")),
        ("allow", lambda i: [f"{a.get('protocol')}:{','.join(a.get('ports') or ['all'])}"
                             for a in i.get("allows") or []]),
        ("sources", lambda i: i.get("sourceRanges") or (
            ["the cluster's own nodes"] if i.get("sourceTags") else None))),
    "gcp:compute/resourcePolicy:ResourcePolicy": (
        ("collocation", _path("groupPlacementPolicy", "collocation")),),
    "gcp:compute/instanceIAMMember:InstanceIAMMember": (("role", _path("role")),),
    "gcp:storage/bucketIAMMember:BucketIAMMember": (("bucket", _path("bucket")),
                                                    ("role", _path("role"))),
}
