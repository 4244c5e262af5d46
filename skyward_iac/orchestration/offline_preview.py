"""Offline previews: what a cloud pool's stack would declare and cost, with no account.

Where a real ``pulumi preview`` cannot run -- no Pulumi engine, no aws/gcp provider plugin or
no credentials on this machine -- ``preview`` and ``skyward-iac plan`` run the stack's own
program under Pulumi mocks instead (``infra/programs/offline.py``) and report every resource it
declares with the inputs a reviewer reads, and the catalog's estimate. There is no provider
diff, so an offline plan file can be read and reviewed but never applied: ``reviewed.load``
refuses it, before anything is created.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyward_iac.api.errors import ConfigError, EngineNotFoundError
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.engine import locate as engine
from skyward_iac.infra.engine.provider_plugins import require_plugin
from skyward_iac.infra.identity.cloud_credentials import require_credentials
from skyward_iac.infra.programs.offline import OfflineDeclaration, declare_offline
from skyward_iac.orchestration import plan_file, reviewed

if TYPE_CHECKING:
    from skyward_iac.orchestration.plan import PoolPlan

#: How every offline report and plan file is marked.
OFFLINE = "offline: no provider diff"
#: Why a forced offline preview is offline.
ASKED = "an offline preview was asked for (--offline)"


def offline_reason(provider: str, forced: bool = False) -> str | None:
    """Why a real preview of a ``provider`` pool cannot run here (the missing engine, plugin
    or credentials, with how to get it), None when it can. ``forced``: offline even so.
    ``ConfigError`` for an offline Local preview: Local's real one needs only the engine."""
    if provider not in offers.CLOUDS:
        if forced:
            raise ConfigError(f"an offline preview declares an aws or gcp pool; a {provider} "
                              "pool's preview runs for real (it needs only the engine)")
        return None
    if forced:
        return ASKED
    try:
        engine.find_engine()
        require_plugin(provider)
        require_credentials(provider)
    except (EngineNotFoundError, ConfigError) as exc:
        return str(exc)
    return None


def offer_summary(choice: offers.Choice) -> dict[str, Any]:
    """The chosen offer as JSON (``preview --json``'s ``offer``, real or offline)."""
    offer = choice.offer
    return {"instance_type": offer.instance_type, "region": offer.region,
            "market": choice.market, "accelerator": offer.accelerator,
            "accelerator_count": offer.accelerator_count, "vcpus": offer.vcpus,
            "memory_gb": offer.memory_gb, "node_hourly_usd": choice.hourly}


class CatalogEstimate:
    """The estimated cost of a previewed pool's starting nodes, from the offer catalog (real
    previews and offline ones alike)."""

    __slots__ = ()
    choice: offers.Choice
    hours: float

    @property
    def hourly(self) -> float:
        """Estimated USD per hour for the starting nodes (0 on Local)."""
        return self.choice.cluster_hourly

    @property
    def estimate(self) -> float:
        """Estimated USD for ``hours`` hours."""
        return self.choice.estimate(self.hours)


@dataclass(frozen=True, slots=True)
class OfflinePreview(CatalogEstimate):
    """A cloud pool declared offline: its resources, offer and catalog estimate."""

    declared: OfflineDeclaration
    choice: offers.Choice
    hours: float
    #: Why it is offline (what a real preview would need, and how to get it).
    reason: str
    #: Where the prices come from: ``aws 2025-06 (shipped)``.
    catalog: offers.Catalog

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (what ``skyward-iac preview --json`` prints offline)."""
        return {
            "offline": True, "note": OFFLINE, "reason": self.reason,
            "provider": self.declared.provider, "offer": offer_summary(self.choice),
            "nodes": len(self.declared.nodes), "decisions": dict(self.declared.decisions),
            "resources": [{"type": r.type, "name": r.name, "inputs": dict(r.inputs)}
                          for r in self.declared.resources],
            "hourly_usd": round(self.hourly, 6), "estimated": self.choice.estimated,
            "hours": self.hours, "estimate_usd": round(self.estimate, 6),
            "catalog": {"as_of": self.catalog.as_of, "origin": self.catalog.origin},
        }


def preview_offline(plan: PoolPlan, hours: float, reason: str) -> OfflinePreview:
    """Declare ``plan``'s stack offline; nothing is created and no cloud is asked."""
    return OfflinePreview(declare_offline(plan.request), plan.choice, hours, reason,
                          offers.current_catalog(plan.provider))


@dataclass(frozen=True, slots=True)
class OfflinePlan:
    """An offline plan file as written: the report it holds, where, and its digest."""

    preview: OfflinePreview
    path: Path
    digest: str


def save_offline_plan(plan: PoolPlan, out: Path, source: dict[str, Any],
                      reason: str) -> OfflinePlan:
    """Write ``plan``'s offline declaration to ``out`` (absolute), sealed like a plan, marked
    ``offline``: a reviewer reads it, ``apply`` refuses it. No stack is created."""
    found = preview_offline(plan, 1.0, reason)
    assert plan.request.created_at is not None
    document: dict[str, Any] = {
        "skyward_plan": plan_file.PLAN_FORMAT, "digest": "", "offline": f"{OFFLINE}: {reason}",
        "created_at": plan.request.created_at.isoformat(), "planned_on": socket.gethostname(),
        "usd_per_hour": plan.usd_per_hour(plan.request), "estimated": plan.choice.estimated,
        "catalog": {"as_of": found.catalog.as_of, "origin": found.catalog.origin},
        "source": source, "facts": reviewed.plan_facts(plan),
        "decisions": dict(found.declared.decisions),
        "resources": _by_name(found.declared),
    }
    document = json.loads(json.dumps(document, default=str))  # the JSON values, as re-read
    document["digest"] = plan_file.digest(document)
    reviewed.write_whole(out, json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    return OfflinePlan(found, out, document["digest"])


def _by_name(declared: OfflineDeclaration) -> dict[str, dict[str, Any]]:
    """``{"node-0": {"type": ..., "inputs": ...}}``; a name two types share is keyed
    ``name [type]`` (as in a real plan's ``resources``)."""
    names = [r.name for r in declared.resources]
    return {(r.name if names.count(r.name) == 1 else f"{r.name} [{r.type}]"):
            {"type": r.type, "inputs": dict(r.inputs)} for r in declared.resources}
