"""The AWS program's requests, replayed against a moto server (aws_replay.py).

Three representative pools -- one spot node in the default VPC; a multi-node EFA pool in a VPC
of its own; an on-demand GPU node with a bucket volume -- are declared by the real program and
created on the server with the calls terraform-provider-aws makes. botocore validates each
request against the service model (shapes), the server checks that every id a request names
exists (connections), and the nodes' role is assumed and used against the server's S3 with
IAM enforcement on (the policy does what it says).

What moto cannot tell, and only a real account can: whether AWS has capacity for the type in
the zone, whether a placement group or an EFA interface can actually be honoured (moto records
both and enforces neither), spot pricing and interruption, the real Deep Learning AMIs (moto's
image catalog has none: an image of the same architecture stands in), and quotas.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from botocore.exceptions import ClientError  # type: ignore[import-untyped]

import skyward_iac as sky
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.programs.aws import aws_program
from skyward_iac.infra.programs.testing import run_program
from skyward_iac.node.data_port import CLOUD_PORT
from tests.s3_server import S3Server, s3_server
from tests.unit import test_aws_program as aws_tests
from tests.unit.aws_replay import MotoMocks, clients, policy, user_data_of

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
CIDR = "203.0.113.7/32"
ACCOUNT = "123456789012"  # moto's account


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    with s3_server() as running:
        yield running


def replay(server: S3Server, name: str, spec: sky.Spec, nodes: int,
           **request: Any) -> tuple[MotoMocks, dict[str, Any]]:
    aws = clients(server.endpoint)
    mocks = MotoMocks(aws)
    program = aws_program(ClusterRequest(name, spec, nodes, **request), lambda: CIDR)
    # The account pin, as ClusterStack.create stores it for these credentials.
    account = aws["sts"].get_caller_identity()["Account"]
    run_program(program, mocks, {"skyward:awsAccountId": account})
    return mocks, aws


def instances(aws: dict[str, Any], mocks: MotoMocks) -> list[dict[str, Any]]:
    ids = [mocks.created[r.name]["id"] for r in mocks.of_type("aws:ec2/instance:Instance")]
    reservations = aws["ec2"].describe_instances(InstanceIds=ids)["Reservations"]
    return sorted((i for r in reservations for i in r["Instances"]),
                  key=lambda i: ids.index(i["InstanceId"]))


def test_one_spot_node_in_the_default_vpc(server: S3Server) -> None:
    spec = aws_tests.aws_spec(ssh_cidr=CIDR, allocation="spot", max_hourly_cost=3.0)
    mocks, aws = replay(server, "replay-spot", spec, 1)
    (node,) = instances(aws, mocks)
    assert node["State"]["Name"] == "running" and node["InstanceLifecycle"] == "spot"
    # Connected: the default VPC's subnet of the zone the catalog named, the stack's group
    # and key pair.
    zone = node["Placement"]["AvailabilityZone"]
    (subnet,) = aws["ec2"].describe_subnets(SubnetIds=[node["SubnetId"]])["Subnets"]
    assert subnet["DefaultForAz"] and subnet["AvailabilityZone"] == zone
    group = mocks.created["cluster"]["id"]
    (interface,) = node["NetworkInterfaces"]
    assert [g["GroupId"] for g in interface["Groups"]] == [group]
    assert interface["SubnetId"] == subnet["SubnetId"]
    assert node["KeyName"] == mocks.created["ssh-key"]["keyName"]
    assert node["MetadataOptions"]["HttpTokens"] == "required"
    (declared,) = mocks.of_type("aws:ec2/instance:Instance")
    assert user_data_of(aws, node["InstanceId"]) == declared.inputs["userData"]
    # The firewall as declared: SSH and the agents' data port from the CIDR, everything from
    # the group, all egress.
    (stored,) = aws["ec2"].describe_security_groups(GroupIds=[group])["SecurityGroups"]
    ingress = {(p["IpProtocol"], p.get("FromPort")): p for p in stored["IpPermissions"]}
    assert ingress.keys() == {("tcp", 22), ("tcp", CLOUD_PORT), ("-1", None)}
    assert ingress[("tcp", 22)]["IpRanges"][0]["CidrIp"] == CIDR
    assert [r["CidrIp"] for r in ingress[("tcp", CLOUD_PORT)]["IpRanges"]] == [CIDR]
    assert ingress[("tcp", CLOUD_PORT)]["ToPort"] == CLOUD_PORT
    assert ingress[("-1", None)]["UserIdGroupPairs"][0]["GroupId"] == group
    assert [r["CidrIp"] for p in stored["IpPermissionsEgress"] for r in p["IpRanges"]] == [
        "0.0.0.0/0"]
    (volume,) = aws["ec2"].describe_volumes(Filters=[
        {"Name": "attachment.instance-id", "Values": [node["InstanceId"]]}])["Volumes"]
    assert volume["Encrypted"] and volume["VolumeType"] == "gp3" and volume["Size"] == 100


def test_a_multi_node_efa_pool_in_its_own_vpc(server: S3Server) -> None:
    spec = aws_tests.aws_spec(sky.accelerators.A100(count=8), ssh_cidr=CIDR,
                              use_default_vpc=False, allocation="on-demand")
    mocks, aws = replay(server, "replay-efa", spec, 2)
    ec2 = aws["ec2"]
    vpc, subnet = mocks.created["vpc"]["id"], mocks.created["subnet"]["id"]
    group = mocks.created["cluster"]["id"]
    # The template's only interface: an EFA in the pool's subnet and group, ids that exist.
    (template,) = ec2.describe_launch_template_versions(
        LaunchTemplateId=mocks.created["efa"]["id"])["LaunchTemplateVersions"]
    (interface,) = template["LaunchTemplateData"]["NetworkInterfaces"]
    assert (interface["InterfaceType"], interface["SubnetId"]) == ("efa", subnet)
    assert interface["Groups"] == [group] and interface["AssociatePublicIpAddress"]
    (stored_subnet,) = ec2.describe_subnets(SubnetIds=[subnet])["Subnets"]
    assert stored_subnet["VpcId"] == vpc and stored_subnet["MapPublicIpOnLaunch"]
    assert ec2.describe_security_groups(GroupIds=[group])["SecurityGroups"][0]["VpcId"] == vpc
    # Both nodes launched from it (moto accepts the template id; it does not apply the
    # template's interfaces, and has no placement groups: the group request is only
    # validated against the EC2 model).
    assert [n["State"]["Name"] for n in instances(aws, mocks)] == ["running", "running"]
    assert mocks.unreplayed == [f"CreatePlacementGroup {mocks.created['placement']['name']}"]
    # The route out: the subnet's table sends 0.0.0.0/0 to the VPC's attached gateway.
    gateway = mocks.created["gateway"]["id"]
    (attached,) = ec2.describe_internet_gateways(InternetGatewayIds=[gateway])[
        "InternetGateways"][0]["Attachments"]
    assert attached["VpcId"] == vpc
    (table,) = ec2.describe_route_tables(Filters=[
        {"Name": "association.subnet-id", "Values": [subnet]}])["RouteTables"]
    assert {r.get("GatewayId") for r in table["Routes"]
            if r.get("DestinationCidrBlock") == "0.0.0.0/0"} == {gateway}
    # EFA's OS-bypass traffic needs the self-referencing egress rule too.
    (stored,) = ec2.describe_security_groups(GroupIds=[group])["SecurityGroups"]
    assert any(pair["GroupId"] == group
               for p in stored["IpPermissionsEgress"] for pair in p["UserIdGroupPairs"])


def test_a_cpu_pool_runs_its_nodes_in_their_own_zones(server: S3Server) -> None:
    """No placement group: a subnet in every zone the pool may use (moto refuses overlapping
    or out-of-VPC blocks), each node in its zone's subnet; in the default VPC, each zone's
    default subnet."""
    spec = aws_tests.aws_spec(None, vcpus=4, ssh_cidr=CIDR, use_default_vpc=False,
                              allocation="on-demand")
    zones = offers.select([spec]).offer.zones
    mocks, aws = replay(server, "replay-zones", spec, 3, node_zones={2: zones[2]})
    vpc = mocks.created["vpc"]["id"]
    subnets = aws["ec2"].describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])[
        "Subnets"]
    assert sorted(s["AvailabilityZone"] for s in subnets) == sorted(zones)
    assert [n["Placement"]["AvailabilityZone"] for n in instances(aws, mocks)] == [
        zones[0], zones[0], zones[2]]
    by_zone = {s["AvailabilityZone"]: s["SubnetId"] for s in subnets}
    assert [n["SubnetId"] for n in instances(aws, mocks)] == [
        by_zone[zones[0]], by_zone[zones[0]], by_zone[zones[2]]]
    default = aws_tests.aws_spec(None, vcpus=4, ssh_cidr=CIDR, allocation="on-demand")
    mocks, aws = replay(server, "replay-default-zones", default, 2, node_zones={1: zones[1]})
    placed = instances(aws, mocks)
    assert [n["Placement"]["AvailabilityZone"] for n in placed] == [zones[0], zones[1]]
    for node in placed:
        (subnet,) = aws["ec2"].describe_subnets(SubnetIds=[node["SubnetId"]])["Subnets"]
        assert subnet["DefaultForAz"]


def test_a_gpu_node_with_a_bucket_volume_can_read_only_its_volume(server: S3Server) -> None:
    volume = sky.Volume("replay-data", "/data", "runs/exp1", read_only=True)
    spec = aws_tests.aws_spec(ssh_cidr=CIDR, allocation="on-demand", volumes=[volume])
    mocks, aws = replay(server, "replay-volume", spec, 1)
    (node,) = instances(aws, mocks)
    profile = mocks.created["volumes-profile"]["name"]
    assert node["IamInstanceProfile"]["Arn"].endswith(f":instance-profile/{profile}")
    (role,) = aws["iam"].get_instance_profile(InstanceProfileName=profile)[
        "InstanceProfile"]["Roles"]
    trust = policy(role["AssumeRolePolicyDocument"])["Statement"][0]
    assert trust["Principal"] == {"Service": "ec2.amazonaws.com"}
    assert aws["iam"].list_role_policies(RoleName=role["RoleName"])["PolicyNames"] == [
        "volumes-policy"]
    # Usable: the node's role, assumed, reads its volume and nothing else (IAM enforced).
    s3 = aws["s3"]
    s3.create_bucket(Bucket="replay-data")
    s3.put_object(Bucket="replay-data", Key="runs/exp1/a.txt", Body=b"mine")
    s3.put_object(Bucket="replay-data", Key="other/b.txt", Body=b"not mine")
    node_s3 = assumed(server, aws, role["Arn"])
    with enforced_iam(server):
        assert node_s3.get_object(Bucket="replay-data", Key="runs/exp1/a.txt")[
            "Body"].read() == b"mine"
        for call in (lambda: node_s3.get_object(Bucket="replay-data", Key="other/b.txt"),
                     lambda: node_s3.put_object(Bucket="replay-data", Key="runs/exp1/c.txt",
                                                Body=b"read-only volume")):
            with pytest.raises(ClientError, match="AccessDenied"):
                call()


def assumed(server: S3Server, aws: dict[str, Any], role_arn: str) -> Any:
    """An S3 client with the credentials of ``role_arn``, as the node's profile gives them."""
    credentials = aws["sts"].assume_role(RoleArn=role_arn, RoleSessionName="node")[
        "Credentials"]
    return clients(server.endpoint, aws_access_key_id=credentials["AccessKeyId"],
                   aws_secret_access_key=credentials["SecretAccessKey"],
                   aws_session_token=credentials["SessionToken"])["s3"]


@contextmanager
def enforced_iam(server: S3Server) -> Iterator[None]:
    """moto's IAM enforcement on for the block (``/moto-api/reset-auth``), off after it."""
    _reset_auth(server, 0)
    try:
        yield
    finally:
        _reset_auth(server, 10**9)


def _reset_auth(server: S3Server, free_requests: int) -> None:
    # Not form-encoded: moto reads the raw body.
    request = urllib.request.Request(f"{server.endpoint}/moto-api/reset-auth",
                                     data=str(free_requests).encode(), method="POST",
                                     headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(request, timeout=10) as response:
        json.loads(response.read())
