"""``preview``: what a ``sky.Compute`` would create and cost, without creating anything.

It resolves the request exactly as ``Compute`` does (validation, offer selection across
several Specs), runs a real ``pulumi preview`` of that stack, then removes the stack again so
the backend keeps only pools that really ran.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from skyward_iac.api.errors import ConfigError, EngineNotFoundError
from skyward_iac.api.spec import Options, Spec
from skyward_iac.infra import engine
from skyward_iac.infra.offers import Choice
from skyward_iac.infra.stack import ClusterStack, Plan

#: The Python package whose ``pulumi-plugin.json`` names each cloud's provider plugin version.
PLUGIN_PACKAGES = {"aws": "pulumi_aws", "gcp": "pulumi_gcp"}


@dataclass(frozen=True, slots=True)
class Preview:
    """A previewed pool: the planned resources, the chosen offer and the estimated cost."""

    plan: Plan
    choice: Choice
    hours: float

    @property
    def hourly(self) -> float:
        """Estimated USD per hour for the starting nodes (0 on Local)."""
        return self.choice.cluster_hourly

    @property
    def estimate(self) -> float:
        """Estimated USD for ``hours`` hours."""
        return self.choice.estimate(self.hours)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (what ``skyward-iac preview --json`` prints)."""
        offer = self.choice.offer
        return {
            "stack": self.plan.stack,
            "provider": offer.provider,
            "offer": {"instance_type": offer.instance_type, "region": offer.region,
                      "market": self.choice.market, "accelerator": offer.accelerator,
                      "accelerator_count": offer.accelerator_count, "vcpus": offer.vcpus,
                      "memory_gb": offer.memory_gb, "node_hourly_usd": self.choice.hourly},
            "nodes": self.choice.nodes,
            "changes": self.plan.changes,
            "resources": [{"op": r.op, "type": r.type, "name": r.name}
                          for r in self.plan.resources],
            "hourly_usd": round(self.hourly, 6),
            "hours": self.hours,
            "estimate_usd": round(self.estimate, 6),
        }


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


def preview(*specs: Spec, options: Options | None = None, hours: float = 1.0,
            on_output: Callable[[str], Any] | None = None, **fields: Any) -> Preview:
    """Preview the stack ``sky.Compute(*specs, options=options, **fields)`` would create.

    Runs a real ``pulumi preview`` (nothing is provisioned), then removes the stack. Returns
    the plan and the estimated USD/hour and USD for ``hours`` of the starting nodes, from the
    offer catalog (Local costs 0). Raises ``ConfigError`` for a bad request and
    ``EngineNotFoundError`` when the engine or the cloud's provider plugin is missing.
    """
    from skyward_iac.orchestration.compute import Compute

    if hours < 0:
        raise ConfigError(f"hours must be >= 0, got {hours}")
    compute = Compute(*specs, options=options, **fields)
    require_plugin(compute.spec.provider.kind)
    # Without tags: a stack that is removed again needs none, and each tag is one CLI call.
    stack = ClusterStack.create(compute.request, tags={})
    try:
        plan = stack.preview(on_output=on_output)
    finally:
        stack.remove()
    return Preview(plan=plan, choice=compute.choice, hours=hours)
