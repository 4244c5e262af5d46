"""Whether a cloud's Pulumi provider plugin is installed where our engine looks for it.

Checked before any cloud stack exists (``Compute``, ``preview``), because the engine runs with
automatic plugin downloads off and its own PULUMI_HOME.
"""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path

from skyward_iac.api.errors import EngineNotFoundError
from skyward_iac.infra.engine import locate as engine

#: The Python package whose ``pulumi-plugin.json`` names each cloud's provider plugin version.
PLUGIN_PACKAGES = {"aws": "pulumi_aws", "gcp": "pulumi_gcp"}


def plugin_version(provider: str) -> str:
    """The provider plugin version the installed Pulumi SDK for ``provider`` needs."""
    text = resources.files(PLUGIN_PACKAGES[provider]).joinpath("pulumi-plugin.json").read_text()
    return str(json.loads(text)["version"])


def require_plugin(provider: str) -> None:
    """Raise ``EngineNotFoundError`` with the install command if ``provider``'s plugin is missing.

    skyward_iac runs the engine with automatic plugin downloads off and its own PULUMI_HOME,
    so a plugin counts only if it is there (or on the engine's PATH).
    """
    if provider not in PLUGIN_PACKAGES:
        return
    version = plugin_version(provider)
    env = engine.engine_env(engine.find_engine())
    plugins = Path(env["PULUMI_HOME"]) / "plugins"
    binary = f"pulumi-resource-{provider}"
    if (plugins / f"resource-{provider}-v{version}" / binary).is_file():
        return
    if shutil.which(binary, path=env["PATH"]):
        return
    raise EngineNotFoundError(
        f"the {provider} provider plugin ({binary} {version}) is not installed in "
        f"{plugins}. Install it with:\n"
        f"  PULUMI_HOME={env['PULUMI_HOME']} {engine.find_engine().binary} plugin install "
        f"resource {provider} {version}\n"
        "(it downloads from Pulumi's release host; see docs/providers.md for offline installs)"
    )
