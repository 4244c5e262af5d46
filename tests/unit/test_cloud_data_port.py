"""The agents' data port on cloud nodes: a fixed port (node/data_port.py ``CLOUD_PORT``) that a
real agent binds and announces, the Cloud objects' choice of where it binds, and the AWS and
GCP programs (under Pulumi mocks) opening it exactly where SSH is open: TCP, that one port, the
SSH source ranges, nothing wider."""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.collections import pki
from skyward_iac.infra.clouds import cloud
from skyward_iac.infra.programs import common
from skyward_iac.node import data_port as node_port
from skyward_iac.node import protocol
from skyward_iac.node.data_port import CLOUD_BIND, CLOUD_PORT
from skyward_iac.node.etcd_server import write_certificates
from skyward_iac.remote import data_port
from skyward_iac.remote.agent_client import AgentClient
from tests.agent_process import TOKEN, running_agent
from tests.unit import test_aws_program as aws_tests
from tests.unit import test_gcp_program as gcp_tests

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
AWS_INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
AWS_EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
GCP_FIREWALL = "gcp:compute/firewall:Firewall"
#: The client's /32 (the default), a whole range, the internet (only if SSH is), and IPv6.
SSH_RANGES = [aws_tests.CALLER, "203.0.113.0/24", "0.0.0.0/0", "2001:db8::/64"]


# -- where the agent binds ---------------------------------------------------------------------


@pytest.mark.parametrize(("bind", "expected"), [
    ("127.0.0.5", ("127.0.0.5", 0)),
    ("127.0.0.5:7000", ("127.0.0.5", 7000)),
    (CLOUD_BIND, ("0.0.0.0", CLOUD_PORT)),
    ("::1", ("::1", 0)),
    ("[::]:7471", ("::", 7471)),
])
def test_a_bind_is_an_address_and_maybe_a_port(bind: str, expected: tuple[str, int]) -> None:
    assert node_port.endpoint(bind) == expected


@pytest.mark.parametrize("bind", ["127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536",
                                  "127.0.0.1:http", ":7471", "[::1]:x"])
def test_a_bad_bind_is_refused(bind: str) -> None:
    with pytest.raises(ValueError, match="ADDR:PORT"):
        node_port.endpoint(bind)


def test_the_fixed_port_is_no_port_ssh_or_etcd_use() -> None:
    assert CLOUD_PORT not in (common.SSH_PORT, *common.ETCD_PORTS)
    assert 1024 <= CLOUD_PORT < 32768  # unprivileged, below Linux's ephemeral range
    common.check_rules(common.ingress_rules(aws_tests.CALLER))


def test_each_provider_says_where_its_agents_bind() -> None:
    # Local: the node's own loopback address, the kernel's port; clouds: every interface on
    # the port their firewall opens.
    assert cloud("local").data_bind("127.0.0.7") == "127.0.0.7"
    for kind in ("aws", "gcp"):
        assert node_port.endpoint(cloud(kind).data_bind("10.0.0.5") or "") == (
            "0.0.0.0", CLOUD_PORT)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_fixed_port_in_use_falls_back_to_the_kernels(caplog: pytest.LogCaptureFixture) -> None:
    with node_port.bind_server("127.0.0.1", 0) as taken:
        port = taken.getsockname()[1]
        with socket.socket() as again, pytest.raises(OSError) as refused:
            again.bind(("127.0.0.1", port))
        assert refused.value.errno == errno.EADDRINUSE
        with node_port.bind_server("127.0.0.1", port) as fallback:
            assert fallback.getsockname()[1] not in (0, port)
    assert f"data port 127.0.0.1:{port} is in use" in caplog.text


@pytest.fixture(scope="module")
def bundle() -> pki.ClusterCertificates:
    return pki.generate_cluster_certificates("cloud-data-port-test", ["127.0.0.1"])


@pytest.fixture
def tls_dir(tmp_path: Path, bundle: pki.ClusterCertificates) -> Path:
    tls = tmp_path / "tls"
    write_certificates(tls, bundle.server)  # as the bootstrap lays them out
    return tls


@pytest.fixture
def fixed_agent(tmp_path: Path, tls_dir: Path) -> Iterator[tuple[int, Path]]:
    """A real agent told to bind a fixed port, as a cloud node's is (another port than
    ``CLOUD_PORT``: this machine may run one)."""
    port, port_file = _free_port(), tmp_path / "a" / "run" / "data.port"
    with running_agent(tmp_path / "a", "--data-bind", f"127.0.0.1:{port}", "--tls-dir",
                       str(tls_dir), "--data-port-file", str(port_file)):
        yield port, tls_dir


def test_an_agent_binds_and_announces_its_fixed_port(
        tmp_path: Path, fixed_agent: tuple[int, Path], bundle: pki.ClusterCertificates) -> None:
    port, _ = fixed_agent
    assert (tmp_path / "a" / "run" / "data.port").read_text().strip() == str(port)
    context = data_port.client_context(data_port.IssuedCertificate(
        bundle.ca_pem, bundle.client_cert_pem, bundle.client_key_pem))
    client = AgentClient(data_port.connect("127.0.0.1", port, context), TOKEN, node=0)
    try:
        assert client.submit("pow", protocol.dumps((pow, (2, 10), {})), timeout=60
                             ).result(60) == 1024
    finally:
        client.close()


def test_a_second_agent_on_the_port_still_starts_on_another(
        tmp_path: Path, fixed_agent: tuple[int, Path]) -> None:
    """The data port never keeps an agent from starting; the one it announces is not the
    first agent's, so the client never reaches an agent of another run through it."""
    port, tls = fixed_agent
    port_file = tmp_path / "b" / "run" / "data.port"
    with running_agent(tmp_path / "b", "--data-bind", f"127.0.0.1:{port}", "--tls-dir",
                       str(tls), "--data-port-file", str(port_file)):
        announced = int(port_file.read_text())
    assert announced != port
    assert "is in use" in (tmp_path / "b" / "agent.log").read_text()


# -- the programs open it where SSH is open ----------------------------------------------------


def _covers(ports: tuple[int, int] | None, port: int) -> bool:
    return ports is None or ports[0] <= port <= ports[1]


def _wider_than(source: str, ssh: str) -> bool:
    network, allowed = ipaddress.ip_network(source), ipaddress.ip_network(ssh)
    return network.version != allowed.version or not network.subnet_of(allowed)  # type: ignore[arg-type]


@pytest.mark.parametrize("ssh_cidr", SSH_RANGES)
def test_the_policy_opens_the_data_port_to_the_ssh_ranges_alone(ssh_cidr: str) -> None:
    rules = common.ingress_rules(ssh_cidr)
    (data,) = [r for r in rules if r.source != common.SELF and _covers(r.ports, CLOUD_PORT)]
    assert (data.protocol, data.ports, data.source) == ("tcp", (CLOUD_PORT, CLOUD_PORT), ssh_cidr)
    # Nothing from outside the cluster is wider than SSH's ranges.
    assert not [r for r in rules if r.source != common.SELF and _wider_than(r.source, ssh_cidr)]


def _aws_cidr(inputs: Mapping[str, Any]) -> str | None:
    return inputs.get("cidrIpv4") or inputs.get("cidrIpv6")


@pytest.mark.parametrize("ssh_cidr", SSH_RANGES)
def test_aws_opens_the_data_port_where_ssh_is(ssh_cidr: str) -> None:
    mocks, _ = aws_tests.run(aws_tests.aws_spec(ssh_cidr=ssh_cidr), 2)
    ssh, data = mocks.named("ingress-ssh").inputs, mocks.named("ingress-data").inputs
    assert (data["ipProtocol"], data["fromPort"], data["toPort"]) == ("tcp", CLOUD_PORT,
                                                                     CLOUD_PORT)
    assert _aws_cidr(data) == _aws_cidr(ssh) == ssh_cidr
    assert data["securityGroupId"] == ssh["securityGroupId"]
    # Every rule from an address range that lets the data port in: exactly this one; and
    # 0.0.0.0/0 reaches it only when it reaches SSH too.
    from_ranges = [r.inputs for r in mocks.of_type(AWS_INGRESS)
                   if "referencedSecurityGroupId" not in r.inputs]
    reaching = [r for r in from_ranges if r["ipProtocol"] == "-1"
                or r["fromPort"] <= CLOUD_PORT <= r["toPort"]]
    assert reaching == [data]
    assert all(not _wider_than(_aws_cidr(r) or "", ssh_cidr) for r in from_ranges)


@pytest.mark.parametrize("ssh_cidr", SSH_RANGES)
def test_gcp_opens_the_data_port_where_ssh_is(ssh_cidr: str) -> None:
    mocks, _ = gcp_tests.run(gcp_tests.gcp_spec(ssh_cidr=ssh_cidr), 2)
    ssh, data = mocks.named("firewall-ssh").inputs, mocks.named("firewall-data").inputs
    assert data["allows"] == [{"protocol": "tcp", "ports": [str(CLOUD_PORT)]}]
    assert data["sourceRanges"] == ssh["sourceRanges"] == [ssh_cidr]
    assert data["targetTags"] == ssh["targetTags"] and data["direction"] == "INGRESS"
    assert data["network"] == ssh["network"]
    from_ranges = [f.inputs for f in mocks.of_type(GCP_FIREWALL) if "sourceRanges" in f.inputs]
    reaching = [f for f in from_ranges if _gcp_lets_in(f, CLOUD_PORT)]
    assert reaching == [data]
    assert all(not _wider_than(r, ssh_cidr) for f in from_ranges for r in f["sourceRanges"])


def _gcp_lets_in(firewall: Mapping[str, Any], port: int) -> bool:
    for allow in firewall["allows"]:
        if allow["protocol"] == "all" or not allow.get("ports"):
            return True
        for item in allow["ports"]:
            low, _, high = item.partition("-")
            if int(low) <= port <= int(high or low):
                return True
    return False


def test_every_aws_rule_description_is_one_ec2_accepts() -> None:
    # EC2 refuses a rule description outside its character set (an apostrophe, say); an
    # EFA pool declares the most rules (the group's own egress besides).
    spec = aws_tests.aws_spec(sky.accelerators.A100(count=8), use_default_vpc=False)
    mocks, _ = aws_tests.run(spec, 2)
    rules = mocks.of_type(AWS_INGRESS) + mocks.of_type(AWS_EGRESS)
    assert len(rules) >= 5
    for rule in rules:
        assert common.AWS_RULE_DESCRIPTION.fullmatch(rule.inputs["description"]), rule.name
