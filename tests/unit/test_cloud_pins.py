"""A cloud stack resolves its SSH CIDR, AWS account and GCP project once, when it is created,
and every later program run declares the stored values (Pulumi mocks; resolvers injected)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.infra.identity import cloud_identity
from skyward_iac.infra.programs import ClusterRequest
from skyward_iac.infra.programs.aws import aws_program
from skyward_iac.infra.programs.gcp import gcp_program
from skyward_iac.infra.programs.pins import Resolvers, config_values, stack_pins
from skyward_iac.infra.programs.testing import ProgramMocks, run_program
from skyward_iac.infra.stacks import stack as stack_module
from skyward_iac.infra.stacks.config import cluster_request
from tests.unit import test_aws_program as aws_tests

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
ACCOUNT = "111122223333"
HOME, CAFE = "203.0.113.7/32", "198.51.100.99/32"


class Counting:
    """Resolvers that answer fixed values and count how often each was asked."""

    def __init__(self, cidr: str = HOME, project: str | None = "env-project") -> None:
        self.asked: list[str] = []
        self.cidr, self.project = cidr, project

    def resolvers(self) -> Resolvers:
        def ask(name: str, value: Any) -> Callable[..., Any]:
            def answer(*_: Any) -> Any:
                self.asked.append(name)
                return value
            return answer
        return Resolvers(caller_cidr=ask("cidr", self.cidr),
                         aws_account_id=ask("account", ACCOUNT),
                         gcp_project=ask("project", self.project))


def aws_request(ssh_cidr: str | None = None) -> ClusterRequest:
    return ClusterRequest("aws-pins", aws_tests.aws_spec(ssh_cidr=ssh_cidr), 2)


def gcp_request(project: str | None = None, ssh_cidr: str | None = None) -> ClusterRequest:
    spec = sky.Spec(provider=sky.GCP(project=project, ssh_cidr=ssh_cidr),
                    accelerator=sky.accelerators.L4())
    return ClusterRequest("gcp-pins", spec, 2)


def provider_inputs(mocks: ProgramMocks, kind: str) -> dict[str, Any]:
    return dict(mocks.named(kind).inputs)


def ssh_rule(mocks: ProgramMocks, kind: str) -> dict[str, Any]:
    name = "ingress-ssh" if kind == "aws" else "firewall-ssh"
    return {k: v for k, v in mocks.named(name).inputs.items() if k != "tags"}


def run(kind: str, request: ClusterRequest, config: dict[str, str],
        lookup: Callable[[], str]) -> ProgramMocks:
    mocks = ProgramMocks(aws_tests.INVOKES if kind == "aws" else None)
    program = (aws_program if kind == "aws" else gcp_program)(request, lookup)
    run_program(program, mocks, config)
    return mocks


# -- resolved once, at creation -----------------------------------------------------------------


def test_aws_pins_ask_each_resolver_once() -> None:
    counting = Counting()
    assert stack_pins(aws_request(), counting.resolvers()) == {
        "sshCidr": HOME, "awsAccountId": ACCOUNT}
    assert sorted(counting.asked) == ["account", "cidr"]


def test_explicit_settings_are_pinned_without_asking() -> None:
    counting = Counting()
    pins = stack_pins(gcp_request(project="mine", ssh_cidr="10.1.2.3/16"), counting.resolvers())
    assert pins == {"sshCidr": "10.1.0.0/16", "project": "mine"}
    assert counting.asked == []


def test_gcp_project_falls_back_to_the_default_and_fails_without_one() -> None:
    assert stack_pins(gcp_request(), Counting().resolvers())["project"] == "env-project"
    with pytest.raises(sky.ConfigError, match="no GCP project"):
        stack_pins(gcp_request(), Counting(project=None).resolvers())


def test_local_stacks_pin_nothing() -> None:
    counting = Counting()
    assert stack_pins(ClusterRequest("l", sky.Spec(provider=sky.Local()), 1),
                      counting.resolvers()) == {}
    assert counting.asked == []


# -- reused by every later run ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["aws", "gcp"])
def test_a_later_run_from_another_network_declares_the_same_ssh_rule(kind: str) -> None:
    request = aws_request() if kind == "aws" else gcp_request(project="p")
    config = config_values(stack_pins(request, Counting(cidr=HOME).resolvers()))
    first = run(kind, request, config, lambda: HOME)
    resized = run(kind, ClusterRequest(request.stack_name, request.spec, 3), config,
                  lambda: CAFE)
    assert ssh_rule(first, kind) == ssh_rule(resized, kind)
    assert HOME in json.dumps(ssh_rule(resized, kind))


@pytest.mark.parametrize("kind", ["aws", "gcp"])
def test_a_stack_without_pins_still_looks_up_each_run(kind: str) -> None:
    request = aws_request() if kind == "aws" else gcp_request(project="p")
    assert CAFE in json.dumps(ssh_rule(run(kind, request, {}, lambda: CAFE), kind))


def test_the_aws_provider_allows_only_the_pinned_account() -> None:
    config = config_values(stack_pins(aws_request(), Counting().resolvers()))
    pinned = provider_inputs(run("aws", aws_request(), config, lambda: CAFE), "aws")
    assert json.loads(pinned["allowedAccountIds"]) == [ACCOUNT]
    # A stack created before pins declares the provider exactly as before.
    unpinned = provider_inputs(run("aws", aws_request(), {}, lambda: CAFE), "aws")
    assert "allowedAccountIds" not in unpinned


def test_the_gcp_provider_uses_the_pinned_project() -> None:
    config = config_values(stack_pins(gcp_request(), Counting().resolvers()))
    mocks = run("gcp", gcp_request(), config, lambda: CAFE)
    assert provider_inputs(mocks, "gcp")["project"] == "env-project"


def test_create_resolves_before_the_stack_exists_and_stores_the_pins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[Any] = []

    class FakeStack:
        name = "aws-pins"

        def set_all_config(self, config: dict[str, Any]) -> None:
            events.append({key: value.value for key, value in config.items()})

        def set_tag(self, key: str, value: str) -> None:
            events.append(("tag", key))

    def create_stack(name: str, _workspace: Any) -> FakeStack:
        events.append(("create", name))
        return FakeStack()

    counting = Counting()
    monkeypatch.setattr(cloud_identity, "RESOLVERS", counting.resolvers())
    monkeypatch.setattr(stack_module, "_workspace", lambda *_: None)
    monkeypatch.setattr(stack_module.home, "secrets_provider", lambda: None)
    monkeypatch.setattr(stack_module.LeanStack, "create", create_stack)
    stack_module.ClusterStack.create(aws_request(), tags={})
    assert events[:2] == [("create", "aws-pins"),
                          {"skyward:sshCidr": HOME, "skyward:awsAccountId": ACCOUNT}]
    assert sorted(counting.asked) == ["account", "cidr"]

    counting.asked.clear()
    failing = Counting(project=None)
    monkeypatch.setattr(cloud_identity, "RESOLVERS", failing.resolvers())
    with pytest.raises(sky.ConfigError, match="no GCP project"):
        stack_module.ClusterStack.create(gcp_request(), tags={})
    assert ("create", "gcp-pins") not in events, "no stack may exist without its pins"


def test_stacks_projects_accept_a_pinned_account() -> None:
    request = cluster_request("aws", {"awsAccountId": ACCOUNT, "sshCidr": HOME}, "p-s")
    assert request.spec.provider.kind == "aws"
    with pytest.raises(sky.ConfigError, match="awsAccountId"):
        cluster_request("gcp", {"awsAccountId": ACCOUNT, "project": "p"}, "p-s")


# -- the real resolvers ------------------------------------------------------------------------


def test_gcp_default_project_follows_the_providers_precedence(tmp_path: Path) -> None:
    gcloud = tmp_path / "gcloud"
    (gcloud / "configurations").mkdir(parents=True)
    (gcloud / "active_config").write_text("work\n")
    (gcloud / "configurations" / "config_work").write_text("[core]\nproject = from-gcloud\n")
    environ = {"CLOUDSDK_CONFIG": str(gcloud)}
    assert cloud_identity.gcp_default_project(environ) == "from-gcloud"
    assert cloud_identity.gcp_default_project(
        {**environ, "CLOUDSDK_CORE_PROJECT": "core", "GOOGLE_PROJECT": "google"}) == "google"
    assert cloud_identity.gcp_default_project({"CLOUDSDK_CONFIG": str(tmp_path / "no")}) is None


def test_aws_account_id_asks_sts(monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import mock_aws

    for variable, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_SESSION_TOKEN": "testing"}.items():
        monkeypatch.setenv(variable, value)
    with mock_aws():
        assert cloud_identity.aws_account_id("us-east-1") == "123456789012"  # moto's account


def test_aws_account_id_without_credentials_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                     "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_STS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(sky.ConfigError, match="AWS account"):
        cloud_identity.aws_account_id("us-east-1")
