"""A cloud pool without its provider plugin or credentials fails before any stack exists.

Real engine, real skyward home: the check runs where a user meets it (``with sky.Compute``),
and the state backend is listed afterwards to prove nothing was created.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.api.errors import ConfigError, EngineNotFoundError
from skyward_iac.infra.engine.provider_plugins import plugin_version, require_plugin
from skyward_iac.infra.stacks import home
from skyward_iac.infra.stacks.stack import list_records

CIDR = "203.0.113.7/32"


def cloud(provider: str) -> sky.AWS | sky.GCP:
    return sky.AWS(ssh_cidr=CIDR) if provider == "aws" else sky.GCP(project="p", ssh_cidr=CIDR)


def stacks_on_record() -> list[str]:
    return sorted(r.name for r in list_records(only_live=True))


def skip_if_plugin_installed(provider: str) -> None:
    try:
        require_plugin(provider)
    except EngineNotFoundError:
        return
    pytest.skip(f"the {provider} plugin is installed here; nothing is missing to test")


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_compute_without_the_plugin_says_what_to_install(provider: str) -> None:
    skip_if_plugin_installed(provider)
    before = stacks_on_record()
    state = sorted(home.state_dir().rglob("*"))
    with pytest.raises(EngineNotFoundError) as caught, sky.Compute(provider=cloud(provider)):
        pytest.fail("the pool must not come up")
    message = str(caught.value)
    assert f"plugin install resource {provider} {plugin_version(provider)}" in message
    assert stacks_on_record() == before
    assert sorted(home.state_dir().rglob("*")) == state, "no stack may be created"


def install_stub_plugin(provider: str) -> None:
    """An executable where the engine looks for the plugin: enough for the presence check."""
    plugin = (home.skyward_home() / "pulumi-home" / "plugins"
              / f"resource-{provider}-v{plugin_version(provider)}" / f"pulumi-resource-{provider}")
    plugin.parent.mkdir(parents=True)
    plugin.write_text("#!/bin/sh\nexit 1\n")
    plugin.chmod(0o755)


def without_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith(("AWS_", "GOOGLE_")) and name != "AWS_CA_BUNDLE":
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_compute_without_credentials_names_what_to_set(
    provider: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    # A home of its own: the stub plugin must not reach the other tests of the session.
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    install_stub_plugin(provider)
    require_plugin(provider)  # the plugin check passes now
    without_credentials(monkeypatch, tmp_path)
    with pytest.raises(ConfigError, match=f"no {provider.upper()} credentials found") as caught, \
            sky.Compute(provider=cloud(provider)):
        pytest.fail("the pool must not come up")
    expected = "AWS_ACCESS_KEY_ID" if provider == "aws" else "GOOGLE_APPLICATION_CREDENTIALS"
    assert expected in str(caught.value)
    assert stacks_on_record() == []
