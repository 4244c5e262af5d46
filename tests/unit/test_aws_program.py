"""The AWS stack program under Pulumi mocks, plus the cloud policy it shares with GCP.

Resources are recorded by ``ProgramMocks`` (inputs arrive camelCase, numbers as floats); the
stack credentials and host keys come from their real dynamic providers.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pulumi.automation as auto
import pytest
from cryptography.hazmat.primitives import serialization

import skyward_iac as sky
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.programs import ClusterRequest, common, program_for
from skyward_iac.infra.programs.aws import aws_program
from skyward_iac.infra.programs.cloud_init import (
    FIRST_CONTACT_GRACE,
    SSH_USER,
    WATCHDOG_PATH,
    watchdog_script,
)
from skyward_iac.infra.programs.common import SELF, IngressRule
from skyward_iac.infra.programs.testing import AWS_INVOKES, ProgramMocks, run_program
from skyward_iac.node.data_port import CLOUD_PORT
from skyward_iac.outputs import parse_outputs as _parse_outputs

CALLER = "198.51.100.7/32"
INSTANCE = "aws:ec2/instance:Instance"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
INVOKES = AWS_INVOKES
A10G, CPU = sky.accelerators.A10G(), None
# pulumi_aws warns about its own deprecated resources when the ec2 module loads.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def aws_spec(accelerator: sky.accelerators.Accelerator | None = A10G, *,
             ssh_cidr: str | None = CALLER, use_default_vpc: bool = True,
             **fields: Any) -> sky.Spec:
    provider = sky.AWS(ssh_cidr=ssh_cidr, use_default_vpc=use_default_vpc)
    return sky.Spec(provider=provider, accelerator=accelerator, **fields)


def run(spec: sky.Spec, nodes: int = 1, **request: Any) -> tuple[ProgramMocks, dict[str, Any]]:
    mocks = ProgramMocks(INVOKES)
    lookup = request.pop("lookup", None)
    program = aws_program(ClusterRequest("aws-test-1", spec, nodes, **request), lookup)
    return mocks, run_program(program, mocks)


def user_data(instance: Any) -> dict[str, Any]:
    text = instance.inputs["userData"]
    assert text.startswith("#cloud-config\n")
    return json.loads(text.removeprefix("#cloud-config\n"))


# -- markets -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allocation", "market"),
    [("spot", "spot"), ("spot-if-available", "spot"), ("on-demand", "on-demand"),
     ("cheapest", "spot")],  # the A10G offers' spot prices are below on-demand in the catalog
)
def test_allocation_picks_the_market(allocation: str, market: str) -> None:
    spec = aws_spec(allocation=allocation)
    choice = offers.select([spec])
    assert choice.market == market
    mocks, _ = run(spec)
    (instance,) = mocks.of_type(INSTANCE)
    options = instance.inputs.get("instanceMarketOptions")
    if market == "spot":
        assert options["marketType"] == "spot"
        assert options["spotOptions"]["instanceInterruptionBehavior"] == "terminate"
        assert options["spotOptions"]["spotInstanceType"] == "one-time"
    else:
        assert options is None
    assert instance.inputs["instanceType"] == choice.offer.instance_type


def test_spot_if_available_runs_on_demand_where_there_is_no_spot_market() -> None:
    spec = aws_spec(sky.accelerators.B200())
    assert offers.select([spec]).offer.spot is None  # precondition from the catalog
    mocks, _ = run(spec)
    assert "instanceMarketOptions" not in mocks.of_type(INSTANCE)[0].inputs


def test_market_override_falls_back_to_on_demand() -> None:
    mocks, _ = run(aws_spec(allocation="spot-if-available"), market="on-demand")
    assert "instanceMarketOptions" not in mocks.of_type(INSTANCE)[0].inputs


def test_spot_max_price_is_the_cost_cap() -> None:
    mocks, _ = run(aws_spec(allocation="spot", max_hourly_cost=2.5))
    spot = mocks.of_type(INSTANCE)[0].inputs["instanceMarketOptions"]["spotOptions"]
    assert float(spot["maxPrice"]) == 2.5


# -- node count, accelerators, disk ------------------------------------------------------------


@pytest.mark.parametrize("nodes", [1, 4])
def test_one_instance_and_one_pinned_host_key_per_node(nodes: int) -> None:
    mocks, outputs = run(aws_spec(), nodes)
    instances = mocks.of_type(INSTANCE)
    assert [i.name for i in instances] == [f"node-{n}" for n in range(nodes)]
    host_keys = [n["host_key"] for n in outputs["nodes"]]
    assert len(set(host_keys)) == nodes
    for instance, node in zip(instances, outputs["nodes"], strict=True):
        config = user_data(instance)
        # The key the node's sshd will present is the one pinned in the outputs.
        assert config["ssh_keys"]["ed25519_public"] == node["host_key"]
        assert config["ssh_deletekeys"] is True and config["ssh_genkeytypes"] == []
        assert instance.inputs["instanceInitiatedShutdownBehavior"] == "terminate"


@pytest.mark.parametrize(("accelerator", "nodes", "placed"),
                         [(A10G, 4, True), (A10G, 1, False), (CPU, 4, False)])
def test_placement_group_only_for_multi_node_accelerated_pools(
    accelerator: Any, nodes: int, placed: bool,
) -> None:
    mocks, _ = run(aws_spec(accelerator), nodes)
    groups = mocks.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert len(groups) == (1 if placed else 0)
    for instance in mocks.of_type(INSTANCE):
        assert ("placementGroup" in instance.inputs) == placed
    if placed:
        assert groups[0].inputs["strategy"] == "cluster"


@pytest.mark.parametrize(
    ("spec", "image", "arch"),
    [(aws_spec(A10G), "Deep Learning Base OSS Nvidia Driver GPU AMI", "x86_64"),
     (aws_spec(CPU), "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64", "x86_64"),
     (aws_spec(CPU, architecture="arm64"), "ubuntu-jammy-22.04-arm64", "arm64"),
     (aws_spec(sky.accelerators.Trainium()), "Deep Learning AMI Neuron", "x86_64")],
)
def test_ami_lookup_follows_accelerator_and_architecture(spec: sky.Spec, image: str,
                                                         arch: str) -> None:
    mocks, _ = run(spec)
    (args,) = [a for token, a in mocks.calls if token == "aws:ec2/getAmi:getAmi"]
    filters = {f["name"]: f["values"] for f in args["filters"]}
    assert image in filters["name"][0] and filters["architecture"] == [arch]
    assert args["mostRecent"] is True
    instance = mocks.of_type(INSTANCE)[0]
    assert instance.inputs["ami"] == INVOKES["aws:ec2/getAmi:getAmi"]["id"]
    assert instance.inputs["instanceType"] == offers.select([spec]).offer.instance_type


@pytest.mark.parametrize(("spec", "size"), [(aws_spec(disk_gb=250), 250),
                                            (aws_spec(CPU), common.DEFAULT_DISK_GB["cpu"]),
                                            (aws_spec(), common.DEFAULT_DISK_GB["accelerated"])])
def test_root_volume_size(spec: sky.Spec, size: int) -> None:
    mocks, _ = run(spec)
    root = mocks.of_type(INSTANCE)[0].inputs["rootBlockDevice"]
    assert root["volumeSize"] == size and root["deleteOnTermination"] is True


def test_a_disk_smaller_than_the_gpu_image_fails_before_any_resource() -> None:
    with pytest.raises(sky.ConfigError, match="disk_gb=20 is smaller"):
        program_for(ClusterRequest("aws-test-1", aws_spec(disk_gb=20), 1))


def test_a_request_no_offer_serves_fails_in_program_for() -> None:
    with pytest.raises(sky.ConfigError, match="accelerator MI300X"):
        program_for(ClusterRequest("aws-test-1", aws_spec(sky.accelerators.MI300X()), 1))


# -- network, region, tags ---------------------------------------------------------------------


def test_default_vpc_uses_the_first_zone_the_catalog_lists() -> None:
    mocks, _ = run(aws_spec())
    (subnet_args,) = [a for t, a in mocks.calls if t == "aws:ec2/getSubnet:getSubnet"]
    assert subnet_args == {"vpcId": "vpc-default", "availabilityZone": "us-east-1a",
                           "defaultForAz": True}
    assert mocks.of_type(INSTANCE)[0].inputs["subnetId"] == "subnet-default"
    assert not mocks.of_type("aws:ec2/vpc:Vpc")
    # The catalog row's zones decide: the cloud's live offerings are not asked.
    assert "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings" not in dict(mocks.calls)


def test_own_vpc_has_a_public_subnet_and_route() -> None:
    mocks, _ = run(aws_spec(use_default_vpc=False))
    assert not [t for t, _ in mocks.calls if t == "aws:ec2/getVpc:getVpc"]
    subnet = mocks.named("subnet")  # the pool's zone (subnets of the others: test_aws_zones)
    assert subnet.inputs["mapPublicIpOnLaunch"] is True
    assert subnet.inputs["availabilityZone"] == "us-east-1a"
    (routes,) = mocks.of_type("aws:ec2/routeTable:RouteTable")
    assert routes.inputs["routes"][0]["cidrBlock"] == "0.0.0.0/0"
    assert mocks.of_type(INSTANCE)[0].inputs["subnetId"] == "subnet-id"


def test_provider_is_pinned_to_the_offer_region() -> None:
    spec = aws_spec(region="eu-west-1")
    mocks, _ = run(spec)
    (provider,) = mocks.of_type("pulumi:providers:aws")
    assert provider.inputs["region"] == "eu-west-1"
    assert all(r.provider and "providers:aws::aws" in r.provider
               for r in mocks.resources if r.typ.startswith("aws:"))


def test_every_resource_is_tagged_with_stack_owner_and_expiry() -> None:
    created = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    mocks, _ = run(aws_spec(ttl=900, use_default_vpc=False), 4, created_at=created)
    taggable = [r for r in mocks.resources if r.typ.startswith("aws:")
                and r.typ != "aws:ec2/routeTableAssociation:RouteTableAssociation"]
    assert len(taggable) > 10
    expires = (created + timedelta(seconds=900)).isoformat(timespec="seconds")
    for resource in taggable:
        tags = resource.inputs["tags"]
        assert tags["skyward-stack"] == "aws-test-1", resource.name
        assert tags["skyward-expires-at"] == expires, resource.name
        assert "@" in tags["skyward-owner"], resource.name
    for instance in mocks.of_type(INSTANCE):
        assert instance.inputs["rootBlockDevice"]["tags"]["skyward-stack"] == "aws-test-1"
    provider = json.loads(mocks.of_type("pulumi:providers:aws")[0].inputs["defaultTags"])
    assert provider["tags"]["skyward-stack"] == "aws-test-1"


# -- security ----------------------------------------------------------------------------------


def _open_ports(rule: Any) -> range:
    if rule.inputs["ipProtocol"] == "-1":
        return range(65536)
    return range(int(rule.inputs["fromPort"]), int(rule.inputs["toPort"]) + 1)


@pytest.mark.parametrize("ssh_cidr", [CALLER, "0.0.0.0/0"])
def test_ssh_from_the_caller_only_and_etcd_never_from_an_address_range(ssh_cidr: str) -> None:
    mocks, _ = run(aws_spec(ssh_cidr=ssh_cidr), 4)
    rules = mocks.of_type(INGRESS)
    from_ranges = [r for r in rules if "referencedSecurityGroupId" not in r.inputs]
    # SSH and the agents' data port (test_cloud_data_port.py), from the SSH ranges alone.
    assert sorted((r.inputs.get("cidrIpv4"), list(_open_ports(r))) for r in from_ranges) == [
        (ssh_cidr, [22]), (ssh_cidr, [CLOUD_PORT])]
    for rule in from_ranges:
        assert not {2379, 2380} & set(_open_ports(rule))
    (internal,) = [r for r in rules if "referencedSecurityGroupId" in r.inputs]
    assert internal.inputs["referencedSecurityGroupId"] == internal.inputs["securityGroupId"]


def test_ssh_defaults_to_the_callers_public_address() -> None:
    mocks, _ = run(aws_spec(ssh_cidr=None), lookup=lambda: "192.0.2.44/32")
    ssh = mocks.named("ingress-ssh")
    assert ssh.inputs["cidrIpv4"] == "192.0.2.44/32"


def test_key_pair_is_the_stacks_key_and_user_data_trusts_it() -> None:
    mocks, outputs = run(aws_spec())
    private = serialization.load_ssh_private_key(outputs["ssh_private_key"].encode(), None)
    public = private.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                               serialization.PublicFormat.OpenSSH).decode()
    (key,) = mocks.of_type("aws:ec2/keyPair:KeyPair")
    assert key.inputs["publicKey"].startswith(public)
    (user,) = [u for u in user_data(mocks.of_type(INSTANCE)[0])["users"] if u != "default"]
    assert user["name"] == SSH_USER and user["ssh_authorized_keys"][0].startswith(public)
    assert mocks.of_type(INSTANCE)[0].inputs["metadataOptions"]["httpTokens"] == "required"


def test_outputs_parse_like_every_other_provider() -> None:
    _, outputs = run(aws_spec(), 2)
    parsed = _parse_outputs({k: auto.OutputValue(v, k != "nodes") for k, v in outputs.items()})
    assert [n.index for n in parsed.nodes] == [0, 1]
    assert all(n.ssh_port == 22 and n.ssh_user == SSH_USER and n.public_address
               and n.private_address and n.host_key.startswith("ssh-ed25519 ")
               for n in parsed.nodes)
    assert parsed.agent_token and "PRIVATE KEY" in parsed.ssh_private_key


def test_a_pool_without_collections_exports_its_pki_for_the_data_port_and_no_etcd() -> None:
    _, with_etcd = run(aws_spec(), 1)
    _, without = run(aws_spec(), 1, collections=False)
    assert "etcd" in with_etcd and "pki" not in with_etcd
    assert "pki" in without and "etcd" not in without
    parsed = _parse_outputs({k: auto.OutputValue(v, k != "nodes") for k, v in without.items()})
    # No etcd: collections stay off; the PKI serves the agents' data port alone.
    assert parsed.etcd is None and parsed.pki is not None and parsed.certificates is parsed.pki


# -- shared policy: firewall guard, ssh cidr, TTL watchdog --------------------------------------


def test_rules_opening_etcd_to_a_range_are_refused() -> None:
    common.check_rules([IngressRule("ok", "all", None, SELF, "")])
    for ports in [(2379, 2379), (2000, 3000), None]:
        with pytest.raises(sky.ConfigError, match="etcd"):
            common.check_rules([IngressRule("bad", "tcp", ports, "0.0.0.0/0", "")])


def test_ssh_cidr_is_normalized_and_validated() -> None:
    assert common.resolve_ssh_cidr("203.0.113.9/24") == "203.0.113.0/24"
    with pytest.raises(sky.ConfigError, match="ssh_cidr"):
        common.resolve_ssh_cidr("not-a-cidr")


def test_ttl_zero_installs_no_watchdog() -> None:
    mocks, _ = run(aws_spec(ttl=0))
    config = user_data(mocks.of_type(INSTANCE)[0])
    assert WATCHDOG_PATH not in [f["path"] for f in config["write_files"]]
    assert config["runcmd"] == []


def test_watchdog_is_armed_with_the_spec_ttl() -> None:
    mocks, _ = run(aws_spec(ttl=300), max_lifetime=7200)
    config = user_data(mocks.of_type(INSTANCE)[0])
    (script,) = [f["content"] for f in config["write_files"] if f["path"] == WATCHDOG_PATH]
    assert script == watchdog_script(300, 7200)
    assert "TTL=300\n" in script and "MAX_LIFETIME=7200\n" in script
    # Boot and bootstrap may take longer than a short ttl: the first contact gets the grace.
    assert FIRST_CONTACT_GRACE > 300 and f"FIRST_CONTACT={FIRST_CONTACT_GRACE}\n" in script
    assert "skyward-watchdog.service" in config["runcmd"][-1]
