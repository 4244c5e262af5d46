"""The replacement table (programs/replacement.py) and the ported image diff-suppress rule
(programs/gcp_images.py) behave as the providers' sources say, and cover every resource type
the cloud programs declare."""

from __future__ import annotations

import pytest

import skyward_iac as sky
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.programs.aws import aws_program
from skyward_iac.infra.programs.gcp import gcp_program
from skyward_iac.infra.programs.gcp_images import disk_image_suppressed, family_matches
from skyward_iac.infra.programs.replacement import RULES, changes, without_ignored
from skyward_iac.infra.programs.testing import (
    AWS_INVOKES,
    DYNAMIC_PREFIX,
    ProgramMocks,
    run_program,
)
from tests.unit import test_aws_program as aws_tests
from tests.unit import test_gcp_program as gcp_tests

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
IMAGES = "https://www.googleapis.com/compute/v1/projects/{}/global/images/{}"
ACCELERATOR = "projects/ubuntu-os-accelerator-images/global/images/family/" \
    "ubuntu-accelerator-2204-amd64-with-nvidia-550"
INSTANCE, GCE = "aws:ec2/instance:Instance", "gcp:compute/instance:Instance"


@pytest.mark.parametrize(("stored", "declared", "same"), [
    # The accelerator family has "amd64" inside its name: the provider's amd64 rule decides
    # against it, so every later update would replace the node.
    (IMAGES.format("ubuntu-os-accelerator-images",
                   "ubuntu-accelerator-2204-amd64-with-nvidia-550-v20250320"), ACCELERATOR, False),
    # Ubuntu LTS families resolve through the Canonical rule, on both architectures.
    (IMAGES.format("ubuntu-os-cloud", "ubuntu-2204-jammy-v20250320"),
     "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts", True),
    (IMAGES.format("ubuntu-os-cloud", "ubuntu-2204-jammy-arm64-v20250320"),
     "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts-arm64", True),
    (IMAGES.format("ubuntu-os-cloud", "ubuntu-2204-jammy-arm64-v20250320"),
     "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts", False),
    # A pinned image: the same self link (any API version), the same partial link, another one.
    (IMAGES.format("ubuntu-os-cloud", "ubuntu-2204-jammy-v20250320"),
     IMAGES.format("ubuntu-os-cloud", "ubuntu-2204-jammy-v20250320").replace("/v1/", "/beta/"),
     True),
    (IMAGES.format("ubuntu-os-cloud", "ubuntu-2204-jammy-v20250320"),
     "projects/ubuntu-os-cloud/global/images/ubuntu-2204-jammy-v20250320", True),
    (IMAGES.format("ubuntu-os-cloud", "ubuntu-2204-jammy-v20250320"),
     "projects/ubuntu-os-cloud/global/images/ubuntu-2204-jammy-v20250401", False),
    (IMAGES.format("ubuntu-os-cloud", "ubuntu-2204-jammy-v20250320"),
     "projects/other-project/global/images/ubuntu-2204-jammy-v20250320", False),
    # Short forms: a project alias, a bare family, a stored value that is not a link.
    (IMAGES.format("debian-cloud", "debian-12-bookworm-v20250320"), "debian/debian-12", True),
    (IMAGES.format("cos-cloud", "cos-117-18613-164-4"), "cos-117-lts", True),
    ("ubuntu-2204-jammy-v20250320", "ubuntu-2204-jammy-v20250320", False),
])
def test_disk_image_suppress_follows_the_provider(stored: str, declared: str, same: bool) -> None:
    assert disk_image_suppressed(stored, declared) is same


def test_the_amd64_rule_decides_alone() -> None:
    # Image and family share "amd64"; the family does not end with it: no match, and none of
    # the later rules (Canonical's included) is asked.
    assert not family_matches("ubuntu-accelerator-2204-amd64-with-nvidia-550-v1",
                              "ubuntu-accelerator-2204-amd64-with-nvidia-550")
    assert family_matches("ubuntu-2210-kinetic-amd64-v1", "ubuntu-2210-amd64")


def test_aws_instance_rules() -> None:
    base = {"ami": "ami-1", "subnetId": "subnet-a", "instanceType": "p4d.24xlarge",
            "userData": "#cloud-config\n{}"}
    assert changes(INSTANCE, base, base).replace == ()
    assert changes(INSTANCE, base, {**base, "placementGroup": "pg"}).replace == ("placementGroup",)
    # Optional+Computed: left out, the stored value stays; a launch template replaces.
    moved = {k: v for k, v in base.items() if k != "subnetId"}
    assert changes(INSTANCE, base, moved).replace == ()
    assert "launchTemplate.#" in changes(INSTANCE, base, {**moved, "launchTemplate": {
        "id": "lt-1"}}).replace
    # User data and the type are applied by stopping the instance (a spot one cannot stop).
    assert changes(INSTANCE, base, {**base, "userData": "other"}).stops == ("userData",)
    assert changes(INSTANCE, base, {**base, "userData": "other",
                                    "userDataReplaceOnChange": True}).replace == ("userData",)
    spot = {**base, "instanceMarketOptions": {"marketType": "spot", "spotOptions": {
        "maxPrice": "2.5000", "spotInstanceType": "one-time"}}}
    cheaper = {**spot, "instanceMarketOptions": {"marketType": "spot", "spotOptions": {
        "maxPrice": "2.5", "spotInstanceType": "one-time"}}}
    assert not changes(INSTANCE, spot, cheaper)  # equal but for trailing zeros
    assert changes(INSTANCE, base, spot).replace[0] == "instanceMarketOptions.#"


def test_gcp_instance_rules() -> None:
    image = IMAGES.format("ubuntu-os-cloud", "ubuntu-2204-jammy-v20250320")
    base = {"name": "n", "zone": "us-central1-a", "machineType": "g2-standard-4",
            "bootDisk": {"initializeParams": {"image": image, "labels": {"a": "1"}}},
            "networkInterfaces": [{"subnetwork": "s", "accessConfigs": [{}]}],
            "scheduling": {"provisioningModel": "SPOT", "maxRunDuration": {"seconds": 3600.0}},
            "labels": {"a": "1"}}
    assert not changes(GCE, base, {**base, "labels": {"a": "2"}, "bootDisk": {
        "initializeParams": {"image": image, "labels": {"a": "2"}}}})  # labels: in place
    assert changes(GCE, base, {**base, "scheduling": {"provisioningModel": "SPOT", "maxRunDuration":
        {"seconds": 7200}}}).replace == ("scheduling.maxRunDuration.seconds",)
    assert changes(GCE, base, {**base, "resourcePolicies": "p"}).stops == ("resourcePolicies",)
    assert changes(GCE, base, {**base, "zone": "us-central1-b"}).replace == ("zone",)
    two = {**base, "networkInterfaces": base["networkInterfaces"] * 2}
    assert changes(GCE, base, two).replace == ("networkInterfaces.#",)
    family = {**base, "bootDisk": {"initializeParams": {"image": ACCELERATOR}}}
    stored = {**base, "bootDisk": {"initializeParams": {"image": IMAGES.format(
        "ubuntu-os-accelerator-images", "ubuntu-accelerator-2204-amd64-with-nvidia-550-v1")}}}
    assert changes(GCE, stored, family).replace == ("bootDisk.initializeParams.image",)


def test_firewall_rules_move_in_place() -> None:
    """A rule's port, protocol, range or description changes in place (EC2
    ``ModifySecurityGroupRules``; a firewall's ``PATCH``): a later change of the data port or
    of the SSH range never recreates the rule, let alone a node."""
    rule = {"securityGroupId": "sg-1", "ipProtocol": "tcp", "fromPort": 22.0, "toPort": 22.0,
            "cidrIpv4": "198.51.100.7/32", "description": "SSH from the client"}
    token = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
    assert not changes(token, rule, {**rule, "fromPort": 7471, "toPort": 7471,
                                     "cidrIpv4": "203.0.113.0/24", "description": "other"})
    # The source's kind and the group are not: the rule is then a new one.
    ipv6 = {k: v for k, v in rule.items() if k != "cidrIpv4"} | {"cidrIpv6": "2001:db8::/64"}
    assert changes(token, rule, ipv6).replace == ("cidrIpv4", "cidrIpv6")
    assert changes(token, rule, {**rule, "securityGroupId": "sg-2"}).replace == (
        "securityGroupId",)
    firewall = {"name": "pool-data", "network": "projects/p/global/networks/pool-net",
                "direction": "INGRESS", "allows": [{"protocol": "tcp", "ports": ["22"]}],
                "sourceRanges": ["198.51.100.7/32"], "targetTags": ["pool-node"]}
    token = "gcp:compute/firewall:Firewall"
    assert not changes(token, firewall, {**firewall, "allows": [
        {"protocol": "tcp", "ports": ["7471"]}], "sourceRanges": ["203.0.113.0/24"]})
    assert changes(token, firewall, {**firewall, "name": "pool-data-2"}).replace == ("name",)


def test_ignore_changes_keeps_the_stored_value() -> None:
    old = {"ami": "ami-1", "bootDisk": {"initializeParams": {"image": "a", "size": 10}}}
    new = {"ami": "ami-2", "bootDisk": {"initializeParams": {"image": "b", "size": 20}}}
    kept = without_ignored(old, new, ["ami", "bootDisk.initializeParams.image"])
    assert kept == {"ami": "ami-1", "bootDisk": {"initializeParams": {"image": "a", "size": 20}}}
    assert new["ami"] == "ami-2"  # the declaration itself is not changed


def _declared_types(program: object, invokes: dict | None = None) -> set[str]:
    mocks = ProgramMocks(invokes)
    run_program(program, mocks)  # type: ignore[arg-type]
    return {r.typ for r in mocks.resources if not r.typ.startswith((DYNAMIC_PREFIX,
                                                                      "pulumi:providers:"))}


def test_the_table_covers_every_type_the_programs_declare() -> None:
    volume = sky.Volume("data-bucket", "/data")
    requests = [
        (aws_program, ClusterRequest("cover-a", aws_tests.aws_spec(
            sky.accelerators.A100(count=8), volumes=[volume]), 2), AWS_INVOKES),
        (aws_program, ClusterRequest("cover-b", aws_tests.aws_spec(use_default_vpc=False), 2),
         AWS_INVOKES),
        (gcp_program, ClusterRequest("cover-c", gcp_tests.gcp_spec(
            volumes=[volume]), 2), None),
    ]
    declared: set[str] = set()
    for make, request, invokes in requests:
        declared |= _declared_types(make(request, lambda: aws_tests.CALLER), invokes)
    assert declared - set(RULES) == set()
    # Every type of the table is one the programs declare: no stale rows.
    assert set(RULES) - declared == set()
