"""Which changed inputs make a cloud provider replace a resource, as the providers define it.

``RULES`` holds, per Pulumi type token the cloud programs declare, the inputs whose change
forces a replacement (``ForceNew`` in the Terraform provider the Pulumi package bridges; a
framework resource's ``RequiresReplace``) and the inputs a provider applies to a running VM only
by stopping it (or that the cloud refuses while it runs). The values come from the providers'
sources; docs/providers.md ("Replacement") names the versions read. ``changes`` compares two
sets of inputs under those rules, with the diff-suppress functions that decide whether a new
value is a change at all (``disk_image_suppressed``: terraform-provider-google's
``DiskImageDiffSuppress``).

Paths are Pulumi input names (camelCase, as the engine and the mocks see them) joined by dots.
A ``#`` segment is a block's presence or length: a ``ForceNew`` block replaces its resource when
it is added or removed. List elements are compared index by index. A path ending in ``?`` is
Optional+Computed in the provider's schema: leaving it out of the new inputs keeps the stored
value, so only adding or changing it counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any

from skyward_iac.infra.programs.gcp_images import disk_image_suppressed

Suppress = Callable[[Any, Any], bool]
#: A conditional replacement (a ``CustomizeDiff``): the paths it replaces for old -> new.
Condition = Callable[[Mapping[str, Any], Mapping[str, Any]], list[str]]

AWS_SOURCE = "hashicorp/terraform-provider-aws"
GCP_SOURCE = "hashicorp/terraform-provider-google-beta"


@dataclass(frozen=True, slots=True)
class Rules:
    """One resource type's replacement rules (see the module doc for the path syntax)."""

    terraform: str
    source: str  # the file in the provider's repository the rules were read from
    replace: tuple[str, ...]
    #: Updated in place only by stopping the VM, or refused by the cloud while it runs.
    stops: tuple[str, ...] = ()
    suppress: Mapping[str, Suppress] = field(default_factory=dict)
    conditions: tuple[Condition, ...] = ()


@dataclass(frozen=True, slots=True)
class Changes:
    """What an update from one set of inputs to another does to the resource."""

    replace: tuple[str, ...] = ()
    stops: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.replace or self.stops)


def _spot_price_suppressed(old: Any, new: Any) -> bool:
    """aws_instance ``spot_options.max_price``: a price dropped from the declaration, or one
    equal but for trailing zeros, is no change."""
    old_text, new_text = str(old or ""), str(new or "")
    return (old_text != "" and new_text == "") or old_text.rstrip("0") == new_text.rstrip("0")


def _last_segment(old: Any, new: Any) -> bool:
    """``CompareSelfLinkOrResourceName``: a self link and a bare name of the same thing match."""
    return str(old).rsplit("/", 1)[-1] == str(new).rsplit("/", 1)[-1]


def _user_data_replaced(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """aws_instance: ``user_data`` forces a new instance when ``user_data_replace_on_change``."""
    if not new.get("userDataReplaceOnChange"):
        return []
    return [k for k in ("userData", "userDataBase64") if old.get(k) != new.get(k)]


def _rule_source_moved(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """aws_vpc_security_group_*_rule ``ModifyPlan``: a rule cannot change its source type."""
    kinds = ("cidrIpv4", "cidrIpv6", "prefixListId", "referencedSecurityGroupId")
    before = [k for k in kinds if old.get(k) is not None]
    after = [k for k in kinds if new.get(k) is not None]
    return sorted(set(before) ^ set(after))


_EC2 = "internal/service/ec2"
_SG_RULE = Rules("aws_vpc_security_group_{}_rule", f"{_EC2}/vpc_security_group_{{}}_rule.go",
                 replace=("securityGroupId",), conditions=(_rule_source_moved,))
_SPOT = "instanceMarketOptions.spotOptions"

RULES: dict[str, Rules] = {
    "aws:ec2/instance:Instance": Rules(
        "aws_instance", f"{_EC2}/ec2_instance.go",
        replace=(
            "ami?", "associatePublicIpAddress?", "availabilityZone?", "cpuOptions.amdSevSnp?",
            "cpuOptions.coreCount?", "cpuOptions.threadsPerCore?", "cpuCoreCount?",
            "cpuThreadsPerCore?", "ebsOptimized?", "enclaveOptions.enabled?",
            "ephemeralBlockDevices?", "hibernation", "hostId?", "instanceMarketOptions.#?",
            "instanceMarketOptions.marketType?", f"{_SPOT}.#?",
            f"{_SPOT}.instanceInterruptionBehavior?", f"{_SPOT}.maxPrice?",
            f"{_SPOT}.spotInstanceType?", f"{_SPOT}.validUntil?", "ipv6Addresses?", "keyName?",
            "launchTemplate.#", "launchTemplate.id?", "launchTemplate.name?",
            "networkInterfaces.deleteOnTermination", "networkInterfaces.deviceIndex",
            "networkInterfaces.networkCardIndex", "networkInterfaces.networkInterfaceId",
            "placementGroup?", "placementPartitionNumber?", "privateDnsNameOptions.#?",
            "privateIp?", "rootBlockDevice.encrypted?", "rootBlockDevice.kmsKeyId?",
            "securityGroups?", "subnetId?", "tenancy?",
        ),
        # ModifyInstanceAttribute between StopInstances and StartInstances (one-time spot
        # instances cannot be stopped); a type of another architecture replaces instead.
        stops=("userData", "userDataBase64", "instanceType"),
        suppress={f"{_SPOT}.maxPrice": _spot_price_suppressed},
        conditions=(_user_data_replaced,),
    ),
    "aws:ec2/keyPair:KeyPair": Rules(
        "aws_key_pair", f"{_EC2}/ec2_key_pair.go",
        replace=("keyName?", "keyNamePrefix?", "publicKey")),
    "aws:ec2/placementGroup:PlacementGroup": Rules(
        "aws_placement_group", f"{_EC2}/ec2_placement_group.go",
        replace=("name", "partitionCount?", "spreadLevel?", "strategy")),
    "aws:ec2/securityGroup:SecurityGroup": Rules(
        "aws_security_group", f"{_EC2}/vpc_security_group.go",
        replace=("description", "name?", "namePrefix?", "vpcId?")),
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": Rules(
        _SG_RULE.terraform.format("ingress"), _SG_RULE.source.format("ingress"),
        replace=_SG_RULE.replace, conditions=_SG_RULE.conditions),
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": Rules(
        _SG_RULE.terraform.format("egress"), _SG_RULE.source.format("egress"),
        replace=_SG_RULE.replace, conditions=_SG_RULE.conditions),
    "aws:ec2/vpc:Vpc": Rules(
        "aws_vpc", f"{_EC2}/vpc_.go",
        replace=("cidrBlock?", "ipv4IpamPoolId", "ipv4NetmaskLength")),
    "aws:ec2/subnet:Subnet": Rules(
        "aws_subnet", f"{_EC2}/vpc_subnet.go",
        replace=("availabilityZone?", "availabilityZoneId?", "cidrBlock?", "ipv4IpamPoolId",
                 "ipv4NetmaskLength", "ipv6IpamPoolId", "ipv6Native", "ipv6NetmaskLength",
                 "outpostArn", "vpcId")),
    # vpc_id is attached and detached in place.
    "aws:ec2/internetGateway:InternetGateway": Rules(
        "aws_internet_gateway", f"{_EC2}/vpc_internet_gateway.go", replace=()),
    "aws:ec2/routeTable:RouteTable": Rules(
        "aws_route_table", f"{_EC2}/vpc_route_table.go", replace=("vpcId",)),
    # route_table_id is replaced in place (ReplaceRouteTableAssociation).
    "aws:ec2/routeTableAssociation:RouteTableAssociation": Rules(
        "aws_route_table_association", f"{_EC2}/vpc_route_table_association.go",
        replace=("subnetId", "gatewayId")),
    # Every other argument is written as a new template version (CreateLaunchTemplateVersion);
    # an instance launched from ``$Default`` keeps the version it was launched from.
    "aws:ec2/launchTemplate:LaunchTemplate": Rules(
        "aws_launch_template", f"{_EC2}/ec2_launch_template.go",
        replace=("name?", "namePrefix?")),
    "aws:iam/role:Role": Rules(
        "aws_iam_role", "internal/service/iam/role.go",
        replace=("name?", "namePrefix?", "path")),
    "aws:iam/rolePolicy:RolePolicy": Rules(
        "aws_iam_role_policy", "internal/service/iam/role_policy.go",
        replace=("name?", "namePrefix?", "role")),
    # role is removed from and added to the profile in place.
    "aws:iam/instanceProfile:InstanceProfile": Rules(
        "aws_iam_instance_profile", "internal/service/iam/instance_profile.go",
        replace=("name?", "namePrefix?", "path")),
    "gcp:compute/instance:Instance": Rules(
        "google_compute_instance", "google-beta/services/compute/resource_compute_instance.go",
        replace=(
            "name", "zone?", "project?", "hostname",
            "bootDisk.#", "bootDisk.deviceName?", "bootDisk.diskEncryptionKeyRaw",
            "bootDisk.kmsKeySelfLink?", "bootDisk.mode", "bootDisk.source?",
            "bootDisk.initializeParams.#?", "bootDisk.initializeParams.image?",
            "bootDisk.initializeParams.type?", "bootDisk.initializeParams.snapshot?",
            "bootDisk.initializeParams.architecture?",
            "bootDisk.initializeParams.resourcePolicies?",
            "bootDisk.initializeParams.provisionedIops?",
            "bootDisk.initializeParams.provisionedThroughput?",
            "bootDisk.initializeParams.enableConfidentialCompute",
            "bootDisk.initializeParams.storagePool",
            "networkInterfaces.#", "networkInterfaces.nicType", "networkInterfaces.queueCount",
            "networkInterfaces.networkAttachment?", "networkInterfaces.vlan",
            "guestAccelerators.#?", "guestAccelerators.count", "guestAccelerators.type",
            "scheduling.preemptible", "scheduling.provisioningModel?",
            "scheduling.terminationTime", "scheduling.maxRunDuration.#",
            "scheduling.maxRunDuration.seconds", "scheduling.maxRunDuration.nanos",
            "scheduling.onInstanceStopAction.#", "confidentialInstanceConfig.#?",
            "reservationAffinity.#?", "scratchDisks.#", "params.#",
        ),
        # needToStopInstanceBeforeUpdating (refused without allow_stopping_for_update), and a
        # compact placement policy, which Compute Engine does not apply to an existing VM.
        stops=("machineType", "serviceAccount", "minCpuPlatform", "networkInterfaces.network",
               "networkInterfaces.subnetwork", "resourcePolicies"),
        suppress={"bootDisk.initializeParams.image": disk_image_suppressed,
                  "guestAccelerators.type": _last_segment},
    ),
    "gcp:compute/network:Network": Rules(
        "google_compute_network", "google-beta/services/compute/resource_compute_network.go",
        replace=("name", "autoCreateSubnetworks", "description", "internalIpv6Range",
                 "networkProfile", "params.#", "project?")),
    "gcp:compute/subnetwork:Subnetwork": Rules(
        "google_compute_subnetwork",
        "google-beta/services/compute/resource_compute_subnetwork.go",
        replace=("name", "network", "description", "externalIpv6Prefix", "internalIpv6Prefix",
                 "params.#", "region?", "reservedInternalRange", "resolveSubnetMask",
                 "project?"),
        suppress={"network": _last_segment}),
    "gcp:compute/firewall:Firewall": Rules(
        "google_compute_firewall", "google-beta/services/compute/resource_compute_firewall.go",
        replace=("name", "direction?", "params.#", "project?"),
        suppress={"network": _last_segment}),
    "gcp:compute/resourcePolicy:ResourcePolicy": Rules(
        "google_compute_resource_policy",
        "google-beta/services/compute/resource_compute_resource_policy.go",
        replace=("region?", "project?", "groupPlacementPolicy.gpuTopology",
                 "groupPlacementPolicy.tpuTopology", "diskConsistencyGroupPolicy.enabled",
                 "workloadPolicy.type")),
    "gcp:compute/instanceIAMMember:InstanceIAMMember": Rules(
        "google_compute_instance_iam_member", "google-beta/services/compute/iam_compute_instance.go"
        " + google-beta/tpgiamresource/resource_iam_member.go",
        replace=("instanceName", "zone?", "project?", "role", "member", "condition.#"),
        suppress={"instanceName": _last_segment}),
    "gcp:projects/iAMCustomRole:IAMCustomRole": Rules(
        "google_project_iam_custom_role",
        "google-beta/services/resourcemanager/resource_google_project_iam_custom_role.go",
        replace=("roleId", "project?")),
    "gcp:serviceaccount/account:Account": Rules(
        "google_service_account",
        "google-beta/services/resourcemanager/resource_google_service_account.go",
        replace=("accountId", "project?")),
    "gcp:storage/bucketIAMMember:BucketIAMMember": Rules(
        "google_storage_bucket_iam_member", "google-beta/services/storage/iam_storage_bucket.go"
        " + google-beta/tpgiamresource/resource_iam_member.go",
        replace=("bucket", "role", "member", "condition.#")),
}


def changes(token: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> Changes:
    """What updating a ``token`` resource from inputs ``old`` to ``new`` does under its
    provider's rules. ``KeyError`` for a type the table does not know: every type the programs
    declare must be in it (tests/unit/test_replacement_oracle.py checks)."""
    rules = RULES[token]
    replaced = [p.rstrip("?") for p in rules.replace if _changed(p, old, new, rules.suppress)]
    for condition in rules.conditions:
        replaced += [p for p in condition(old, new) if p not in replaced]
    stopped = [p for p in rules.stops if _changed(p, old, new, rules.suppress)]
    return Changes(tuple(replaced), tuple(stopped))


def _changed(path: str, old: Mapping[str, Any], new: Mapping[str, Any],
             suppress: Mapping[str, Suppress]) -> bool:
    computed = path.endswith("?")
    clean = path.rstrip("?")
    return _differs(old, new, clean.split("."), computed, suppress.get(clean))


def _differs(old: Any, new: Any, parts: Sequence[str], computed: bool,
             suppress: Suppress | None) -> bool:
    if new is None and computed:
        return False  # left out: the provider keeps what it stored
    if not parts:
        return not _same(old, new) and not (suppress is not None and suppress(old, new))
    head, rest = parts[0], parts[1:]
    if head == "#":
        return _count(old) != _count(new)
    if isinstance(old, list) or isinstance(new, list):
        return any(_differs(o, n, parts, computed, suppress)
                   for o, n in zip_longest(_items(old), _items(new)) if o is not None
                   and n is not None)
    return _differs(_get(old, head), _get(new, head), rest, computed, suppress)


def _same(old: Any, new: Any) -> bool:
    if isinstance(old, bool) or isinstance(new, bool):
        return old is new or old == new
    if isinstance(old, (int, float)) and isinstance(new, (int, float)):
        return float(old) == float(new)  # the engine's numbers are floats
    return bool(old == new)


def _count(value: Any) -> int:
    if isinstance(value, list):
        return len(value)
    return 0 if value is None else 1


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [] if value is None else [value]


def _get(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, Mapping) else None


def without_ignored(old: Mapping[str, Any], new: Mapping[str, Any],
                    ignore_changes: Sequence[str]) -> dict[str, Any]:
    """``new`` with every ``ignore_changes`` path set back to its ``old`` value, as the engine
    does before it diffs (top-level names and dotted nested paths)."""
    result = _copy(new)
    for path in ignore_changes:
        _put(result, path.split("."), _lookup(old, path.split(".")))
    return result


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _lookup(value: Any, parts: Sequence[str]) -> Any:
    for part in parts:
        value = _get(value, part)
    return value


def _put(target: dict[str, Any], parts: Sequence[str], value: Any) -> None:
    for part in parts[:-1]:
        child = target.get(part)
        if not isinstance(child, dict):
            if value is None:
                return
            child = target[part] = {}
        target = child
    if value is None:
        target.pop(parts[-1], None)
    else:
        target[parts[-1]] = _copy(value)
