"""``preview`` (Python and CLI): a real ``pulumi preview`` that creates and keeps nothing, and
an offline one where the cloud's provider plugin is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.api.errors import EngineNotFoundError, StackNotFoundError
from skyward_iac.cli import main
from skyward_iac.infra.engine.provider_plugins import plugin_version, require_plugin
from skyward_iac.infra.stacks import home
from skyward_iac.infra.stacks.stack import ClusterStack
from skyward_iac.orchestration.offline_preview import OFFLINE, OfflinePreview
from skyward_iac.orchestration.preview import preview
from tests.helpers import stack_sandboxes

pytestmark = pytest.mark.integration


def assert_left_nothing(stack_name: str) -> None:
    with pytest.raises(StackNotFoundError):
        ClusterStack.select(stack_name)
    leftovers = [p for p in home.state_dir().rglob(f"{stack_name}*") if p.is_file()]
    assert leftovers == [], "the removed preview stack left files in the backend"
    assert not (home.workspace_dir() / f"Pulumi.{stack_name}.yaml").exists()
    assert stack_sandboxes(stack_name) == []


def test_local_preview_plans_credentials_and_nodes_for_free() -> None:
    result = preview(provider=sky.Local(), nodes=3, hours=5)
    plan = result.plan
    assert [r.name for r in plan.of_type(":StackCredentials")] == ["credentials"]
    assert [r.name for r in plan.of_type(":LocalNode")] == ["node-0", "node-1", "node-2"]
    assert {r.op for r in plan.resources} == {"create"}
    assert plan.changes["create"] == len(plan.resources)
    assert "+ pulumi-python:dynamic/skyward:LocalNode: (create)" in plan.text  # the engine's diff
    assert (result.hourly, result.estimate, result.hours) == (0.0, 0.0, 5)
    assert_left_nothing(plan.stack)


def test_cli_preview_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["preview", "--provider", "local", "--nodes", "1", "--hours", "2", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["provider"] == "local" and report["nodes"] == 1
    assert report["hourly_usd"] == 0 and report["estimate_usd"] == 0 and report["hours"] == 2
    kinds = [r["type"].rsplit(":", 1)[-1] for r in report["resources"]]
    assert kinds.count("StackCredentials") == 1 and kinds.count("LocalNode") == 1
    assert report["changes"]["create"] == len(report["resources"])
    assert_left_nothing(report["stack"])


def test_invalid_request_fails_before_any_stack_exists() -> None:
    before = sorted(home.state_dir().rglob("*"))
    with pytest.raises(sky.ConfigError, match="nodes must be at least 1"):
        preview(provider=sky.Local(), nodes=0)
    with pytest.raises(sky.ConfigError, match="hours must be >= 0"):
        preview(provider=sky.Local(), hours=-1)
    assert sorted(home.state_dir().rglob("*")) == before


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_cloud_preview_without_the_plugin_goes_offline_and_says_how_to_install_it(
    provider: str, capsys: pytest.CaptureFixture[str],
) -> None:
    try:
        require_plugin(provider)
    except EngineNotFoundError:
        pass
    else:
        pytest.skip(f"the {provider} plugin is installed here; nothing is missing")
    config = sky.AWS(ssh_cidr="203.0.113.7/32") if provider == "aws" else \
        sky.GCP(project="p", ssh_cidr="203.0.113.7/32")
    before = sorted(home.state_dir().rglob("*"))
    version = plugin_version(provider)
    install = f"plugin install resource {provider} {version}"
    # offline=False: the real preview or nothing, as before offline previews existed.
    with pytest.raises(EngineNotFoundError) as caught:
        preview(provider=config, nodes=1, offline=False)
    message = str(caught.value)
    assert f"pulumi-resource-{provider} {version}" in message and install in message
    assert f"PULUMI_HOME={Path(home.skyward_home()) / 'pulumi-home'}" in message
    # By default the pool is declared offline, and the reason says what to install.
    result = preview(provider=config, nodes=1)
    assert isinstance(result, OfflinePreview) and install in result.reason
    assert [n.name for n in result.declared.nodes] == ["node-0"]
    assert sorted(home.state_dir().rglob("*")) == before, "no stack may be created"
    # The CLI prints the offline declaration, marked, with the same install command.
    assert main(["preview", "--provider", provider, "--ssh-cidr", "203.0.113.7/32"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(OFFLINE) and install in out
    assert sorted(home.state_dir().rglob("*")) == before
