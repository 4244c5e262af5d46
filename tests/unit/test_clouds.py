"""One object per provider (infra/clouds/): each answers for its cloud, none branches on kind."""

from __future__ import annotations

import pytest

import skyward_iac as sky
from skyward_iac.infra import clouds
from skyward_iac.infra.clouds import AWS, GCP, LOCAL, cloud, cloud_of_stack
from skyward_iac.infra.identity import cloud_credentials
from skyward_iac.infra.identity.cloud_credentials import require_credentials
from skyward_iac.infra.programs import ClusterRequest, pins, program_for
from skyward_iac.infra.programs.decisions import StackProgram
from skyward_iac.infra.stacks.config import known_keys

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_each_kind_has_its_object_and_an_unknown_kind_is_a_config_error() -> None:
    assert [cloud(kind) for kind in ("local", "aws", "gcp")] == [LOCAL, AWS, GCP]
    assert {c.kind for c in clouds.CLOUDS.values()} == {"local", "aws", "gcp"}
    with pytest.raises(sky.ConfigError, match="'azure' is not one of local, aws, gcp"):
        cloud("azure")


@pytest.mark.parametrize(("name", "kind"), [("aws-ana-20261125-203700-a1b2c3", "aws"),
                                            ("gcp-bo-20261125-203700-a1b2c3", "gcp"),
                                            ("local-x-1", "local"), ("my-stack", "local")])
def test_a_stack_name_says_its_cloud(name: str, kind: str) -> None:
    assert cloud_of_stack(name).kind == kind


def test_what_each_cloud_pins() -> None:
    assert LOCAL.pin_keys == ()
    assert AWS.pin_keys[:2] == (pins.SSH_CIDR, pins.AWS_ACCOUNT_ID)
    assert GCP.pin_keys[:2] == (pins.SSH_CIDR, pins.GCP_PROJECT)
    assert pins.IDENTITY in GCP.pin_keys and pins.IDENTITY not in AWS.pin_keys
    assert set(pins.DECIDED) <= set(AWS.pin_keys) and set(pins.DECIDED) <= set(GCP.pin_keys)
    # The stacks/ projects accept exactly the cloud's keys (and no cloud-only key for Local).
    assert "identity" in known_keys("gcp") and "awsAccountId" not in known_keys("gcp")
    assert "instanceType" not in known_keys("local")


@pytest.mark.parametrize("kind", ["aws", "gcp"])
def test_a_cloud_builds_its_own_program(kind: str) -> None:
    provider = sky.AWS(ssh_cidr="198.51.100.7/32") if kind == "aws" else sky.GCP(
        ssh_cidr="198.51.100.7/32", project="p")
    program = cloud(kind).program(ClusterRequest("x", sky.Spec(provider=provider), 1))
    assert isinstance(program, StackProgram) and program.provider == kind
    assert program_for(ClusterRequest("x", sky.Spec(provider=provider), 1)).provider == kind


def test_local_builds_its_program_and_moves_no_node() -> None:
    request = ClusterRequest("x", sky.Spec(provider=sky.Local()), 2)
    assert callable(program_for(request)) and not isinstance(program_for(request), StackProgram)
    assert not LOCAL.nodes_move_alone(request) and LOCAL.on_this_machine


def test_credentials_are_asked_of_the_cloud(monkeypatch: pytest.MonkeyPatch) -> None:
    require_credentials("local")  # this machine needs none
    monkeypatch.setattr(cloud_credentials, "gcp_credential_source", lambda: None)
    with pytest.raises(sky.ConfigError, match="no GCP credentials found.*GOOGLE_APPLICATION"):
        require_credentials("gcp")
    monkeypatch.setattr(cloud_credentials, "gcp_credential_source", lambda: "adc")
    require_credentials("gcp")
