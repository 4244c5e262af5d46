"""The GCP stack program under Pulumi mocks: scheduling, GPUs, placement, labels, firewalls."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pulumi.automation as auto
import pytest

import skyward_iac as sky
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.programs import ClusterRequest, common, program_for
from skyward_iac.infra.programs.cloud_init import SSH_USER
from skyward_iac.infra.programs.gcp import gcp_program
from skyward_iac.infra.programs.testing import ProgramMocks, run_program
from skyward_iac.node.data_port import CLOUD_PORT
from skyward_iac.outputs import parse_outputs as _parse_outputs

CALLER = "198.51.100.7/32"
INSTANCE = "gcp:compute/instance:Instance"
FIREWALL = "gcp:compute/firewall:Firewall"
PLACEMENT = "gcp:compute/resourcePolicy:ResourcePolicy"
L4, T4, CPU = sky.accelerators.L4(), sky.accelerators.T4(), None
# pulumi_gcp warns about its own deprecated resources when the compute module loads.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
LABEL = re.compile(r"^[a-z0-9_-]{0,63}$")


def gcp_spec(accelerator: sky.accelerators.Accelerator | None = L4, *,
             ssh_cidr: str | None = CALLER, zone: str | None = None, **fields: Any) -> sky.Spec:
    provider = sky.GCP(ssh_cidr=ssh_cidr, zone=zone, project="my-project")
    return sky.Spec(provider=provider, accelerator=accelerator, **fields)


def run(spec: sky.Spec, nodes: int = 1, **request: Any) -> tuple[ProgramMocks, dict[str, Any]]:
    mocks = ProgramMocks()
    lookup = request.pop("lookup", None)
    program = gcp_program(ClusterRequest("GCP-test_1", spec, nodes, **request), lookup)
    return mocks, run_program(program, mocks)


def user_data(instance: Any) -> dict[str, Any]:
    return json.loads(instance.inputs["metadata"]["user-data"].removeprefix("#cloud-config\n"))


@pytest.mark.parametrize(("allocation", "spot"), [("spot", True), ("spot-if-available", True),
                                                  ("on-demand", False), ("cheapest", True)])
def test_allocation_picks_spot_or_standard_scheduling(allocation: str, spot: bool) -> None:
    spec = gcp_spec(allocation=allocation)
    assert (offers.select([spec]).market == "spot") == spot
    mocks, _ = run(spec)
    scheduling = mocks.of_type(INSTANCE)[0].inputs["scheduling"]
    if spot:
        assert scheduling["provisioningModel"] == "SPOT" and scheduling["preemptible"] is True
        assert scheduling["instanceTerminationAction"] == "DELETE"
        assert scheduling["automaticRestart"] is False
    else:
        assert scheduling["provisioningModel"] == "STANDARD"
        assert scheduling["preemptible"] is False
        assert "instanceTerminationAction" not in scheduling


@pytest.mark.parametrize("allocation", ["spot", "on-demand"])
def test_max_lifetime_is_a_hard_backstop_that_deletes(allocation: str) -> None:
    mocks, _ = run(gcp_spec(allocation=allocation), max_lifetime=6 * 3600)
    scheduling = mocks.of_type(INSTANCE)[0].inputs["scheduling"]
    assert scheduling["maxRunDuration"] == {"seconds": 6 * 3600}
    assert scheduling["instanceTerminationAction"] == "DELETE"


def test_no_max_lifetime_no_run_duration_cap() -> None:
    mocks, _ = run(gcp_spec())
    assert "maxRunDuration" not in mocks.of_type(INSTANCE)[0].inputs["scheduling"]


@pytest.mark.parametrize(("accelerator", "nodes", "placed"),
                         [(L4, 4, True), (L4, 1, False), (CPU, 4, False), (T4, 4, False)])
def test_nodes_and_compact_placement(accelerator: Any, nodes: int, placed: bool) -> None:
    mocks, outputs = run(gcp_spec(accelerator), nodes)
    instances = mocks.of_type(INSTANCE)
    assert len(instances) == len(outputs["nodes"]) == nodes
    assert len({n["host_key"] for n in outputs["nodes"]}) == nodes
    policies = mocks.of_type(PLACEMENT)
    assert len(policies) == (1 if placed else 0)
    for instance in instances:
        assert ("resourcePolicies" in instance.inputs) == placed
    if placed:  # T4s attach to N1 machines, which take no compact placement policy
        assert policies[0].inputs["groupPlacementPolicy"] == {"collocation": "COLLOCATED"}


def test_attached_gpus_on_n1_and_bundled_gpus_on_g2() -> None:
    mocks, _ = run(gcp_spec(sky.accelerators.T4(count=4), allocation="on-demand"))
    n1 = mocks.of_type(INSTANCE)[0].inputs
    assert n1["machineType"].startswith("n1-")
    assert n1["guestAccelerators"] == [{"type": "nvidia-tesla-t4", "count": 4}]
    assert n1["scheduling"]["onHostMaintenance"] == "TERMINATE"  # GPUs cannot live-migrate
    mocks, _ = run(gcp_spec(L4))
    g2 = mocks.of_type(INSTANCE)[0].inputs
    assert g2["machineType"].startswith("g2-") and "guestAccelerators" not in g2
    assert "ubuntu-accelerator" in g2["bootDisk"]["initializeParams"]["image"]


def test_cpu_nodes_migrate_and_boot_plain_ubuntu_for_their_architecture() -> None:
    mocks, _ = run(gcp_spec(CPU, architecture="arm64", allocation="on-demand"))
    inputs = mocks.of_type(INSTANCE)[0].inputs
    assert inputs["machineType"].startswith("t2a-")
    # The newest image of the family, by its self link (never the family itself).
    (lookup,) = [a for token, a in mocks.calls if token == "gcp:compute/getImage:getImage"]
    assert (lookup["project"], lookup["family"]) == ("ubuntu-os-cloud", "ubuntu-2204-lts-arm64")
    assert inputs["bootDisk"]["initializeParams"]["image"] == (
        "https://www.googleapis.com/compute/v1/projects/ubuntu-os-cloud/global/images/"
        "ubuntu-2204-lts-arm64-v20260101")
    assert inputs["scheduling"]["onHostMaintenance"] == "MIGRATE"


@pytest.mark.parametrize(("spec", "size", "disk_type"), [
    (gcp_spec(disk_gb=500), 500, "pd-balanced"),
    (gcp_spec(CPU), common.DEFAULT_DISK_GB["cpu"], "pd-balanced"),
    (gcp_spec(sky.accelerators.H200()), common.DEFAULT_DISK_GB["accelerated"],
     "hyperdisk-balanced"),
])
def test_boot_disk_size_and_type(spec: sky.Spec, size: int, disk_type: str) -> None:
    mocks, _ = run(spec)
    disk = mocks.of_type(INSTANCE)[0].inputs["bootDisk"]
    assert disk["autoDelete"] is True
    assert disk["initializeParams"]["size"] == size
    assert disk["initializeParams"]["type"] == disk_type


def test_zone_is_the_configured_one_or_the_first_offering_the_type() -> None:
    spec = gcp_spec()
    mocks, _ = run(spec)
    assert mocks.of_type(INSTANCE)[0].inputs["zone"] == offers.select([spec]).offer.zones[0]
    mocks, _ = run(gcp_spec(zone="us-east1-c"))
    assert mocks.of_type(INSTANCE)[0].inputs["zone"] == "us-east1-c"
    (provider,) = mocks.of_type("pulumi:providers:gcp")
    assert provider.inputs["region"] == "us-east1" and provider.inputs["project"] == "my-project"


def test_labels_everywhere_and_valid() -> None:
    created = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    mocks, _ = run(gcp_spec(), 2, created_at=created)
    for instance in mocks.of_type(INSTANCE):
        for labels in (instance.inputs["labels"],
                       instance.inputs["bootDisk"]["initializeParams"]["labels"]):
            assert labels["skyward-stack"] == "gcp-test_1"
            assert labels["skyward-expires-at"].startswith("2026-01-02t03_14_05")
            assert labels["skyward-owner"]
            assert all(LABEL.match(k) and LABEL.match(v) for k, v in labels.items())
    defaults = json.loads(mocks.of_type("pulumi:providers:gcp")[0].inputs["defaultLabels"])
    assert defaults["skyward-stack"] == "gcp-test_1"
    for resource in mocks.resources:
        if "name" in resource.inputs and resource.typ.startswith("gcp:"):
            assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", resource.inputs["name"])


def _ports(firewall: Any) -> set[int]:
    ports: set[int] = set()
    for allow in firewall.inputs["allows"]:
        if allow["protocol"] == "all" or not allow.get("ports"):
            return set(range(65536))
        for item in allow["ports"]:
            low, _, high = item.partition("-")
            ports |= set(range(int(low), int(high or low) + 1))
    return ports


@pytest.mark.parametrize("ssh_cidr", [CALLER, "0.0.0.0/0"])
def test_firewalls_ssh_from_the_caller_etcd_only_inside(ssh_cidr: str) -> None:
    mocks, _ = run(gcp_spec(ssh_cidr=ssh_cidr), 4)
    firewalls = mocks.of_type(FIREWALL)
    tag = mocks.of_type(INSTANCE)[0].inputs["tags"][0]
    from_ranges = [f for f in firewalls if "sourceRanges" in f.inputs]
    # SSH and the agents' data port (test_cloud_data_port.py), from the SSH ranges alone.
    assert sorted((f.inputs["sourceRanges"], sorted(_ports(f))) for f in from_ranges) == [
        ([ssh_cidr], [22]), ([ssh_cidr], [CLOUD_PORT])]
    assert all(not {2379, 2380} & _ports(f) for f in from_ranges)
    (inside,) = [f for f in firewalls if "sourceTags" in f.inputs]
    assert inside.inputs["sourceTags"] == inside.inputs["targetTags"] == [tag]
    assert all(f.inputs["direction"] == "INGRESS" and f.inputs["targetTags"] == [tag]
               for f in firewalls)


def test_ssh_defaults_to_the_callers_public_address() -> None:
    mocks, _ = run(gcp_spec(ssh_cidr=None), lookup=lambda: "192.0.2.44/32")
    assert mocks.named("firewall-ssh").inputs["sourceRanges"] == ["192.0.2.44/32"]


def test_metadata_carries_the_stack_key_and_the_pinned_host_key() -> None:
    mocks, outputs = run(gcp_spec(), 2)
    for instance, node in zip(mocks.of_type(INSTANCE), outputs["nodes"], strict=True):
        metadata = instance.inputs["metadata"]
        user, _, key = metadata["ssh-keys"].partition(":")
        assert user == SSH_USER and key.startswith("ssh-ed25519 ")
        assert metadata["block-project-ssh-keys"] == "TRUE"
        assert metadata["enable-oslogin"] == "FALSE"
        config = user_data(instance)
        assert config["ssh_keys"]["ed25519_public"] == node["host_key"]
        assert "BEGIN OPENSSH PRIVATE KEY" in config["ssh_keys"]["ed25519_private"]
        (skyward,) = [u for u in config["users"] if u != "default"]
        assert skyward["ssh_authorized_keys"] == [key]


def test_outputs_parse_like_every_other_provider() -> None:
    _, outputs = run(gcp_spec(), 3)
    parsed = _parse_outputs({k: auto.OutputValue(v, k != "nodes") for k, v in outputs.items()})
    assert [n.index for n in parsed.nodes] == [0, 1, 2]
    assert len({n.public_address for n in parsed.nodes}) == 3
    assert all(n.ssh_user == SSH_USER and n.workdir == "/opt/skyward" for n in parsed.nodes)


def test_zone_outside_the_catalog_fails_before_provisioning() -> None:
    with pytest.raises(sky.ConfigError, match="zone us-central1-b"):
        program_for(ClusterRequest("gcp-test-1", gcp_spec(sky.accelerators.H100(),
                                                          zone="us-central1-b"), 1))
