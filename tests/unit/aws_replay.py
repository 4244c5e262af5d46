"""Replay an AWS stack program as boto3 calls against a moto server (test_aws_moto_replay.py).

``MotoMocks`` runs the real program under Pulumi mocks, but answers each invoke (AMI, default
VPC and subnet, zone offerings) from the server and creates each resource there with the call
terraform-provider-aws makes for it (``RunInstances``, ``CreateLaunchTemplate``, ...), built from
the resource's resolved inputs. The ids the server returns become the resource's outputs, so a
later resource's inputs carry real ids: an instance's subnet, group, key, placement group, launch
template and instance profile must all exist for its launch to succeed. botocore validates every
request against the EC2 and IAM service models before it is sent; moto then checks what it
models (ids that exist, CIDRs inside their VPC, IAM policy documents).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from typing import Any

import boto3  # type: ignore[import-untyped]
import dill  # type: ignore[import-untyped]
import pulumi

from skyward_iac.infra.programs.testing import DYNAMIC_PREFIX, ProgramMocks, Registered

REGION = "us-east-1"


def clients(endpoint: str, **keys: str) -> dict[str, Any]:
    """boto3 clients of the moto server at ``endpoint`` (test keys unless ``keys`` given)."""
    credentials = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", **keys}
    return {name: boto3.client(name, endpoint_url=endpoint, region_name=REGION, **credentials)
            for name in ("ec2", "iam", "sts", "s3")}


def _tags(inputs: Mapping[str, Any], resource: str) -> list[dict[str, Any]]:
    tags = inputs.get("tags") or {}
    if not tags:
        return []
    return [{"ResourceType": resource,
             "Tags": [{"Key": k, "Value": str(v)} for k, v in sorted(tags.items())]}]


def _flag(value: Any) -> bool:
    """Launch template booleans are strings in the Pulumi schema ("true")."""
    return value if isinstance(value, bool) else str(value).lower() == "true"


def _int(value: Any) -> int:
    return int(float(value))


class MotoMocks(ProgramMocks):
    """Pulumi mocks backed by a moto server (see module doc)."""

    def __init__(self, aws: dict[str, Any]) -> None:
        super().__init__()
        self.aws = aws
        #: Whether the AMI lookup found an image by its name; moto's catalog lacks Deep
        #: Learning and Ubuntu 22.04 images, so otherwise one of the same architecture stands in.
        self.ami_found = True
        #: Logical name -> the id and outputs the server gave the resource.
        self.created: dict[str, dict[str, Any]] = {}
        #: Requests validated against the service model but not sent (moto lacks them).
        self.unreplayed: list[str] = []

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict[str, Any]:
        self.calls.append((args.token, dict(args.args)))
        answer = INVOKES.get(args.token)
        return answer(self, dict(args.args)) if answer else {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        inputs = dict(args.inputs)
        if args.typ.startswith(DYNAMIC_PREFIX):
            serialized = inputs.pop("__provider")
            provider = dill.loads(base64.b64decode(
                serialized["value"] if isinstance(serialized, dict) else serialized))
            self.resources.append(Registered(args.typ, args.name, inputs, args.provider))
            result = provider.create(inputs)
            return str(result.id), dict(result.outs or {})
        self.resources.append(Registered(args.typ, args.name, inputs, args.provider))
        create = CREATE.get(args.typ)
        if create is None:  # the explicit provider: nothing to call
            return f"{args.name}-id", inputs
        resource_id, outputs = create(self, args.name, inputs)
        self.created[args.name] = {"id": resource_id, **outputs}
        return resource_id, {**inputs, **outputs}


# -- invokes ---------------------------------------------------------------------------------


def _get_ami(mocks: MotoMocks, args: dict[str, Any]) -> dict[str, Any]:
    ec2 = mocks.aws["ec2"]
    filters = [{"Name": f["name"], "Values": f["values"]} for f in args.get("filters", [])]
    images = ec2.describe_images(Owners=args.get("owners") or [], Filters=filters)["Images"]
    if not images:
        mocks.ami_found = False
        arch = [f for f in filters if f["Name"] == "architecture"]
        images = ec2.describe_images(Filters=arch)["Images"]
    newest = max(images, key=lambda image: image.get("CreationDate", ""))
    return {"id": newest["ImageId"], "rootDeviceName": newest.get("RootDeviceName")}


def _get_vpc(mocks: MotoMocks, args: dict[str, Any]) -> dict[str, Any]:
    vpcs = mocks.aws["ec2"].describe_vpcs(
        Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    return {"id": vpcs[0]["VpcId"]}


def _get_subnet(mocks: MotoMocks, args: dict[str, Any]) -> dict[str, Any]:
    subnets = mocks.aws["ec2"].describe_subnets(Filters=[
        {"Name": "vpc-id", "Values": [args["vpcId"]]},
        {"Name": "availability-zone", "Values": [args["availabilityZone"]]},
        {"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
    return {"id": subnets[0]["SubnetId"]}


def _get_offerings(mocks: MotoMocks, args: dict[str, Any]) -> dict[str, Any]:
    filters = [{"Name": f["name"], "Values": f["values"]} for f in args.get("filters", [])]
    offers = mocks.aws["ec2"].describe_instance_type_offerings(
        LocationType=args["locationType"], Filters=filters)["InstanceTypeOfferings"]
    return {"locations": [o["Location"] for o in offers]}


INVOKES: dict[str, Callable[[MotoMocks, dict[str, Any]], dict[str, Any]]] = {
    "aws:ec2/getAmi:getAmi": _get_ami,
    "aws:ec2/getVpc:getVpc": _get_vpc,
    "aws:ec2/getSubnet:getSubnet": _get_subnet,
    "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings": _get_offerings,
}


# -- resources: the calls terraform-provider-aws makes -----------------------------------------

Created = tuple[str, dict[str, Any]]


def _vpc(m: MotoMocks, name: str, i: dict[str, Any]) -> Created:
    ec2 = m.aws["ec2"]
    vpc = ec2.create_vpc(CidrBlock=i["cidrBlock"], TagSpecifications=_tags(i, "vpc"))["Vpc"]
    for attribute in ("enableDnsHostnames", "enableDnsSupport"):
        if attribute in i:
            key = attribute[0].upper() + attribute[1:]
            ec2.modify_vpc_attribute(VpcId=vpc["VpcId"], **{key: {"Value": bool(i[attribute])}})
    return vpc["VpcId"], {}


def _gateway(m: MotoMocks, name: str, i: dict[str, Any]) -> Created:
    ec2 = m.aws["ec2"]
    gateway = ec2.create_internet_gateway(TagSpecifications=_tags(i, "internet-gateway"))
    gateway_id = gateway["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=gateway_id, VpcId=i["vpcId"])
    return gateway_id, {}


def _route_table(m: MotoMocks, name: str, i: dict[str, Any]) -> Created:
    ec2 = m.aws["ec2"]
    table = ec2.create_route_table(VpcId=i["vpcId"], TagSpecifications=_tags(i, "route-table"))
    table_id = table["RouteTable"]["RouteTableId"]
    for route in i.get("routes") or []:
        ec2.create_route(RouteTableId=table_id, DestinationCidrBlock=route["cidrBlock"],
                         GatewayId=route["gatewayId"])
    return table_id, {}


def _subnet(m: MotoMocks, name: str, i: dict[str, Any]) -> Created:
    ec2 = m.aws["ec2"]
    subnet = ec2.create_subnet(VpcId=i["vpcId"], CidrBlock=i["cidrBlock"],
                               AvailabilityZone=i["availabilityZone"],
                               TagSpecifications=_tags(i, "subnet"))["Subnet"]
    if i.get("mapPublicIpOnLaunch"):
        ec2.modify_subnet_attribute(SubnetId=subnet["SubnetId"],
                                    MapPublicIpOnLaunch={"Value": True})
    return subnet["SubnetId"], {"availabilityZone": subnet["AvailabilityZone"]}


def _association(m: MotoMocks, name: str, i: dict[str, Any]) -> Created:
    association = m.aws["ec2"].associate_route_table(RouteTableId=i["routeTableId"],
                                                     SubnetId=i["subnetId"])
    return association["AssociationId"], {}


def _security_group(m: MotoMocks, name: str, i: dict[str, Any]) -> Created:
    ec2 = m.aws["ec2"]
    group_name = f"{i.get('namePrefix', '')}{name}"
    group = ec2.create_security_group(GroupName=group_name, Description=i["description"],
                                      VpcId=i["vpcId"],
                                      TagSpecifications=_tags(i, "security-group"))
    # The provider removes AWS's default allow-all egress rule right after creating a group.
    ec2.revoke_security_group_egress(GroupId=group["GroupId"], IpPermissions=[
        {"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}])
    return group["GroupId"], {"name": group_name}


def _permission(i: dict[str, Any]) -> dict[str, Any]:
    permission: dict[str, Any] = {"IpProtocol": i["ipProtocol"]}
    if "fromPort" in i:
        permission["FromPort"], permission["ToPort"] = _int(i["fromPort"]), _int(i["toPort"])
    description = {"Description": i["description"]} if i.get("description") else {}
    if i.get("cidrIpv4"):
        permission["IpRanges"] = [{"CidrIp": i["cidrIpv4"], **description}]
    elif i.get("cidrIpv6"):
        permission["Ipv6Ranges"] = [{"CidrIpv6": i["cidrIpv6"], **description}]
    elif i.get("referencedSecurityGroupId"):
        permission["UserIdGroupPairs"] = [{"GroupId": i["referencedSecurityGroupId"],
                                           **description}]
    return permission


def _rule(direction: str) -> Callable[[MotoMocks, str, dict[str, Any]], Created]:
    def create(m: MotoMocks, name: str, i: dict[str, Any]) -> Created:
        authorize = getattr(m.aws["ec2"], f"authorize_security_group_{direction}")
        answer = authorize(GroupId=i["securityGroupId"], IpPermissions=[_permission(i)])
        return answer["SecurityGroupRules"][0]["SecurityGroupRuleId"], {}
    return create


def _key_pair(m: MotoMocks, name: str, i: dict[str, Any]) -> Created:
    key_name = f"{i.get('keyNamePrefix', '')}{name}"
    pair = m.aws["ec2"].import_key_pair(KeyName=key_name,
                                        PublicKeyMaterial=i["publicKey"].encode())
    return pair["KeyPairId"], {"keyName": key_name}


def _placement_group(m: MotoMocks, name: str, i: dict[str, Any]) -> Created:
    # moto has no CreatePlacementGroup (NotImplementedError): the group's shape is checked
    # against the EC2 model, and it is not created.
    group_name = i.get("name") or f"{name}-group"
    request = {"GroupName": group_name, "Strategy": i["strategy"]}
    validate(m.aws["ec2"], "CreatePlacementGroup", request)
    m.unreplayed.append(f"CreatePlacementGroup {group_name}")
    return group_name, {"name": group_name}


def _launch_template(m: MotoMocks, name: str, i: dict[str, Any]) -> Created:
    interfaces = [{
        "DeviceIndex": _int(n["deviceIndex"]), "NetworkCardIndex": _int(n["networkCardIndex"]),
        "InterfaceType": n["interfaceType"], "SubnetId": n["subnetId"],
        "Groups": n["securityGroups"],
        "AssociatePublicIpAddress": _flag(n["associatePublicIpAddress"]),
        "DeleteOnTermination": _flag(n["deleteOnTermination"]),
    } for n in i.get("networkInterfaces") or []]
    template = m.aws["ec2"].create_launch_template(
        LaunchTemplateName=f"{i.get('namePrefix', '')}{name}",
        LaunchTemplateData={"NetworkInterfaces": interfaces},
        TagSpecifications=_tags(i, "launch-template"))
    return template["LaunchTemplate"]["LaunchTemplateId"], {}


def _instance(m: MotoMocks, name: str, i: dict[str, Any]) -> Created:
    ec2 = m.aws["ec2"]
    (image,) = ec2.describe_images(ImageIds=[i["ami"]])["Images"]
    root = i["rootBlockDevice"]
    request: dict[str, Any] = {
        "ImageId": i["ami"], "InstanceType": i["instanceType"], "MinCount": 1, "MaxCount": 1,
        "KeyName": i["keyName"],
        "InstanceInitiatedShutdownBehavior": i["instanceInitiatedShutdownBehavior"],
        "BlockDeviceMappings": [{"DeviceName": image["RootDeviceName"], "Ebs": {
            "VolumeSize": _int(root["volumeSize"]), "VolumeType": root["volumeType"],
            "Encrypted": root["encrypted"], "DeleteOnTermination": root["deleteOnTermination"]}}],
        "MetadataOptions": {"HttpEndpoint": i["metadataOptions"]["httpEndpoint"],
                            "HttpTokens": i["metadataOptions"]["httpTokens"],
                            "HttpPutResponseHopLimit":
                                _int(i["metadataOptions"]["httpPutResponseHopLimit"])},
        "UserData": i["userData"],
        "TagSpecifications": _tags(i, "instance"),
    }
    if template := i.get("launchTemplate"):
        request["LaunchTemplate"] = {"LaunchTemplateId": template["id"]}
    elif "associatePublicIpAddress" in i:
        # The provider moves subnet, groups and the public address into one interface spec.
        request["NetworkInterfaces"] = [{
            "DeviceIndex": 0, "SubnetId": i["subnetId"], "Groups": i["vpcSecurityGroupIds"],
            "AssociatePublicIpAddress": i["associatePublicIpAddress"],
            "DeleteOnTermination": True}]
    if i.get("placementGroup"):
        request["Placement"] = {"GroupName": i["placementGroup"]}
    if market := i.get("instanceMarketOptions"):
        spot = market["spotOptions"]
        request["InstanceMarketOptions"] = {"MarketType": market["marketType"], "SpotOptions": {
            "SpotInstanceType": spot["spotInstanceType"],
            "InstanceInterruptionBehavior": spot["instanceInterruptionBehavior"],
            **({"MaxPrice": spot["maxPrice"]} if spot.get("maxPrice") else {})}}
    if i.get("iamInstanceProfile"):
        request["IamInstanceProfile"] = {"Name": i["iamInstanceProfile"]}
    (instance,) = ec2.run_instances(**request)["Instances"]
    return instance["InstanceId"], {"privateIp": instance.get("PrivateIpAddress"),
                                    "publicIp": instance.get("PublicIpAddress")}


def _role(m: MotoMocks, name: str, i: dict[str, Any]) -> Created:
    role_name = f"{i.get('namePrefix', '')}{name}"
    tags = [{"Key": k, "Value": str(v)} for k, v in sorted((i.get("tags") or {}).items())]
    m.aws["iam"].create_role(RoleName=role_name, AssumeRolePolicyDocument=i["assumeRolePolicy"],
                             Description=i.get("description", ""), Tags=tags)
    return role_name, {"name": role_name}


def _role_policy(m: MotoMocks, name: str, i: dict[str, Any]) -> Created:
    m.aws["iam"].put_role_policy(RoleName=i["role"], PolicyName=name,
                                 PolicyDocument=i["policy"])
    return f"{i['role']}:{name}", {"name": name}


def _profile(m: MotoMocks, name: str, i: dict[str, Any]) -> Created:
    iam = m.aws["iam"]
    profile_name = f"{i.get('namePrefix', '')}{name}"
    iam.create_instance_profile(InstanceProfileName=profile_name)
    iam.add_role_to_instance_profile(InstanceProfileName=profile_name, RoleName=i["role"])
    return profile_name, {"name": profile_name}


CREATE: dict[str, Callable[[MotoMocks, str, dict[str, Any]], Created]] = {
    "aws:ec2/vpc:Vpc": _vpc,
    "aws:ec2/internetGateway:InternetGateway": _gateway,
    "aws:ec2/routeTable:RouteTable": _route_table,
    "aws:ec2/subnet:Subnet": _subnet,
    "aws:ec2/routeTableAssociation:RouteTableAssociation": _association,
    "aws:ec2/securityGroup:SecurityGroup": _security_group,
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": _rule("ingress"),
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": _rule("egress"),
    "aws:ec2/keyPair:KeyPair": _key_pair,
    "aws:ec2/placementGroup:PlacementGroup": _placement_group,
    "aws:ec2/launchTemplate:LaunchTemplate": _launch_template,
    "aws:ec2/instance:Instance": _instance,
    "aws:iam/role:Role": _role,
    "aws:iam/rolePolicy:RolePolicy": _role_policy,
    "aws:iam/instanceProfile:InstanceProfile": _profile,
}


def validate(client: Any, operation: str, params: dict[str, Any]) -> None:
    """Validate ``params`` for ``operation`` against the client's service model (botocore's
    ``ParamValidationError`` when a shape is wrong), without sending the request."""
    from botocore.validate import validate_parameters  # type: ignore[import-untyped]

    validate_parameters(params, client.meta.service_model.operation_model(operation).input_shape)


def user_data_of(aws: Mapping[str, Any], instance_id: str) -> str:
    """The user data the server stored for an instance, decoded."""
    value = aws["ec2"].describe_instance_attribute(InstanceId=instance_id,
                                                   Attribute="userData")["UserData"]["Value"]
    return base64.b64decode(value).decode()


def policy(document: Any) -> dict[str, Any]:
    """An IAM policy document as IAM returns it (URL-decoded by boto3, or already a dict)."""
    return document if isinstance(document, dict) else dict(json.loads(document))
