"""A real 1-node pool on AWS and GCP: runs only where credentials and provider plugins exist.

`pytest -m cloud tests/cloud` bills a few cents: the cheapest on-demand CPU node for a few
minutes. Each test is skipped, with the reason, when its cloud is not set up (see
docs/providers.md for what is needed).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.api.errors import EngineNotFoundError
from skyward_iac.infra.engine.provider_plugins import plugin_version, require_plugin
from skyward_iac.infra.stacks import home
from skyward_iac.infra.stacks.stack import ClusterStack

pytestmark = pytest.mark.cloud


def aws_credentials() -> str | None:
    """Why AWS cannot run here, or None when some credential source is configured."""
    if os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_PROFILE"):
        return None
    if (Path.home() / ".aws" / "credentials").is_file() or (
            Path.home() / ".aws" / "config").is_file():
        return None
    return "no AWS credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE or ~/.aws/)"


def gcp_credentials() -> str | None:
    """Why GCP cannot run here, or None when credentials and a project are configured."""
    adc = Path.home() / ".config" / "gcloud" / "application_default_credentials.json"
    if not (os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") or adc.is_file()):
        return "no GCP credentials (GOOGLE_APPLICATION_CREDENTIALS or gcloud ADC)"
    if not (os.environ.get("GOOGLE_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT")):
        return "no GCP project (set GOOGLE_PROJECT)"
    return None


#: The plugins installed for real runs (tests/conftest.py gives each session a fresh home).
PLUGINS = Path(os.environ.get("SKYWARD_CLOUD_PLUGINS")
               or Path.home() / ".skyward" / "pulumi-home" / "plugins")


@pytest.fixture(autouse=True)
def installed_plugins() -> None:
    """Let the session's engine see the plugins in ``PLUGINS``."""
    session = home.skyward_home() / "pulumi-home" / "plugins"
    if PLUGINS.is_dir() and not session.exists():
        session.parent.mkdir(parents=True, exist_ok=True)
        session.symlink_to(PLUGINS, target_is_directory=True)


def skip_unless_ready(provider: str, credentials: str | None) -> None:
    try:
        require_plugin(provider)
    except EngineNotFoundError:
        version = plugin_version(provider)
        pytest.skip(f"the {provider} provider plugin {version} is not in {PLUGINS} (set "
                    f"SKYWARD_CLOUD_PLUGINS, or install it: PULUMI_HOME={PLUGINS.parent} "
                    f"pulumi plugin install resource {provider} {version})")
    if credentials:
        pytest.skip(credentials)


@sky.function
def where() -> tuple[str, str]:
    return platform.node(), platform.machine()


def run_one_node_pool(config: sky.AWS | sky.GCP) -> None:
    compute = sky.Compute(provider=config, nodes=1, allocation="on-demand", ttl=900,
                          architecture="x86_64")
    with compute as pool:
        host, machine = where() >> pool
        assert host and machine == "x86_64"
        stack_name = pool.stack_name
    assert ClusterStack.select(stack_name).resource_count() == 0, "destroy left resources"


def test_aws_one_node_pool() -> None:
    skip_unless_ready("aws", aws_credentials())
    run_one_node_pool(sky.AWS(region=os.environ.get("SKYWARD_TEST_AWS_REGION", "us-east-1")))


def test_gcp_one_node_pool() -> None:
    skip_unless_ready("gcp", gcp_credentials())
    project = os.environ.get("GOOGLE_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT")
    run_one_node_pool(sky.GCP(project=project,
                              region=os.environ.get("SKYWARD_TEST_GCP_REGION", "us-central1")))
