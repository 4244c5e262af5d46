"""GPU networking under Pulumi mocks: an EFA primary interface for multi-node pools of AWS
types that have one, gVNIC on GCP A3; every other pool declares what it declared before."""

from __future__ import annotations

from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.infra.programs.aws_network import EFA_TYPES
from skyward_iac.infra.programs.testing import ProgramMocks
from tests.unit import test_aws_program as aws_tests
from tests.unit import test_gcp_program as gcp_tests

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
#: What a node declares to join its subnet when it has no EFA (as before EFA support).
PLAIN = {"subnetId": "subnet-default", "vpcSecurityGroupIds": ["cluster-id"],
         "associatePublicIpAddress": True}
acc = sky.accelerators


def aws_nodes(accelerator: acc.Accelerator | None, nodes: int,
              **request: Any) -> tuple[ProgramMocks, list[dict[str, Any]]]:
    mocks, _ = aws_tests.run(aws_tests.aws_spec(accelerator), nodes, **request)
    return mocks, [dict(r.inputs) for r in mocks.of_type(aws_tests.INSTANCE)]


@pytest.mark.parametrize(("accelerator", "machine"), [
    (acc.H100(count=8), "p5.48xlarge"), (acc.A100(count=8), "p4de.24xlarge"),
    (acc.A10G(count=8), "g5.48xlarge"), (acc.Trainium(count=16), "trn1.32xlarge"),
])
@pytest.mark.parametrize(("nodes", "max_nodes"), [(2, None), (1, 4)])
def test_multi_node_efa_pools_get_an_efa_primary_interface(
    accelerator: acc.Accelerator, machine: str, nodes: int, max_nodes: int | None,
) -> None:
    mocks, instances = aws_nodes(accelerator, nodes, max_nodes=max_nodes)
    assert machine in EFA_TYPES and {i["instanceType"] for i in instances} == {machine}
    [template] = mocks.of_type(TEMPLATE)
    [interface] = template.inputs["networkInterfaces"]
    assert interface == {"deviceIndex": 0, "networkCardIndex": 0, "interfaceType": "efa",
                         "subnetId": "subnet-default", "securityGroups": ["cluster-id"],
                         "associatePublicIpAddress": "true", "deleteOnTermination": "true"}
    for node in instances:
        # The template brings subnet, group and address; AWS refuses them twice on one launch.
        assert node["launchTemplate"] == {"id": f"{template.name}-id"}
        assert not set(PLAIN) & set(node)
        assert node["placementGroup"]


def test_efa_pools_pass_all_traffic_within_their_group_both_ways() -> None:
    mocks, _ = aws_nodes(acc.H100(count=8), 2)
    inbound = mocks.named("ingress-cluster").inputs
    outbound = mocks.named("egress-cluster").inputs
    for rule in (inbound, outbound):
        assert rule["ipProtocol"] == "-1" and "fromPort" not in rule
        assert rule["referencedSecurityGroupId"] == rule["securityGroupId"] == "cluster-id"


@pytest.mark.parametrize(("accelerator", "nodes", "max_nodes"), [
    (acc.H100(count=8), 1, None),   # an EFA type alone: nobody to talk to
    (acc.A100(count=8), 1, 1),
    (acc.A10G(), 2, None),          # g5.xlarge has no EFA
    (acc.T4(count=4), 2, None),
    (None, 3, None),
])
def test_other_aws_pools_declare_what_they_did_before(
    accelerator: acc.Accelerator | None, nodes: int, max_nodes: int | None,
) -> None:
    mocks, instances = aws_nodes(accelerator, nodes, max_nodes=max_nodes)
    assert not mocks.of_type(TEMPLATE)
    assert [r.name for r in mocks.of_type(EGRESS)] == ["egress-all"]
    for node in instances:
        assert {k: node[k] for k in PLAIN} == PLAIN and "launchTemplate" not in node


def gcp_interfaces(accelerator: acc.Accelerator | None, nodes: int) -> list[dict[str, Any]]:
    mocks, _ = gcp_tests.run(gcp_tests.gcp_spec(accelerator), nodes)
    return [dict(r.inputs["networkInterfaces"][0]) for r in mocks.of_type(gcp_tests.INSTANCE)]


@pytest.mark.parametrize("accelerator", [acc.H100(), acc.H200()])
@pytest.mark.parametrize("nodes", [1, 2])
def test_a3_nodes_use_gvnic_on_an_image_that_supports_it(accelerator: acc.Accelerator,
                                                        nodes: int) -> None:
    mocks, _ = gcp_tests.run(gcp_tests.gcp_spec(accelerator), nodes)
    for node in mocks.of_type(gcp_tests.INSTANCE):
        assert node.inputs["machineType"].startswith("a3-")
        assert node.inputs["networkInterfaces"][0]["nicType"] == "GVNIC"
        image = node.inputs["bootDisk"]["initializeParams"]["image"]
        assert "/projects/ubuntu-os-accelerator-images/" in image  # gVNIC-capable


@pytest.mark.parametrize(("accelerator", "nodes"), [
    (acc.L4(), 2), (acc.A100(count=8), 2), (acc.T4(), 1), (None, 1)])
def test_other_gcp_nodes_keep_the_default_nic(accelerator: acc.Accelerator | None,
                                              nodes: int) -> None:
    for interface in gcp_interfaces(accelerator, nodes):
        assert interface == {"subnetwork": "subnet-id", "accessConfigs": [{}]}
