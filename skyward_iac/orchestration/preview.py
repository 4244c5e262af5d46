"""``preview``: what a ``sky.Compute`` would create and cost, without creating anything.

It resolves the request exactly as ``Compute`` does (validation, offer selection across
several Specs), runs a real ``pulumi preview`` of that stack, then removes the stack again so
the backend keeps only pools that really ran. An AWS or GCP pool on a machine without the
engine, the provider plugin or credentials is declared offline instead
(``offline_preview.py``): its own program under mocks, no provider diff.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.options import Options
from skyward_iac.api.spec import Spec
from skyward_iac.infra.capacity.offers import Choice
from skyward_iac.infra.engine import locate as engine
from skyward_iac.infra.engine.provider_plugins import require_plugin
from skyward_iac.infra.stacks import planned
from skyward_iac.infra.stacks.stack import ClusterStack, Plan
from skyward_iac.infra.stacks.tags import stack_tags
from skyward_iac.orchestration import reviewed
from skyward_iac.orchestration.offline_preview import (
    CatalogEstimate,
    OfflinePlan,
    OfflinePreview,
    offer_summary,
    offline_reason,
    preview_offline,
    save_offline_plan,
)
from skyward_iac.orchestration.plan import PoolPlan, plan_pool


@dataclass(frozen=True, slots=True)
class Preview(CatalogEstimate):
    """A previewed pool: the planned resources, the chosen offer and the estimated cost."""

    plan: Plan
    choice: Choice
    hours: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (what ``skyward-iac preview --json`` prints)."""
        return {
            "offline": False,
            "stack": self.plan.stack,
            "provider": self.choice.offer.provider,
            "offer": offer_summary(self.choice),
            "nodes": self.choice.nodes,
            "changes": self.plan.changes,
            "resources": [{"op": r.op, "type": r.type, "name": r.name}
                          for r in self.plan.resources],
            "hourly_usd": round(self.hourly, 6),
            "hours": self.hours,
            "estimate_usd": round(self.estimate, 6),
        }


def save_reviewed_plan(specs: tuple[Spec, ...], name: str | None, options: Options,
                       fields: dict[str, Any], out: Path,
                       source: dict[str, Any] | None = None,
                       plan_ttl: float = planned.DEFAULT_PLAN_TTL,
                       offline: bool | None = None) -> tuple[Any, Any] | OfflinePlan:
    """``skyward-iac plan``: create the pool's stack (kept, empty, until the plan is applied
    or ``plan_ttl`` seconds passed) and write its sealed plan to ``out``. Returns (the
    previewed changes, the ``ReviewedPlan``); on any failure no stack stays behind.

    Where a real preview cannot run (``offline`` None: see ``preview``) it writes an offline
    plan instead and returns its ``OfflinePlan``: no stack, readable, never applied."""
    out = Path(os.path.abspath(out.expanduser()))  # the engine runs in a directory of its own
    if out.is_dir() or not out.parent.is_dir():
        raise ConfigError(f"--out {out}: not a file in an existing directory")
    plan = plan_pool(specs, name, options, fields)
    if reason := _offline(plan, offline):
        return save_offline_plan(plan, out, source or {}, reason)
    engine.find_engine()
    require_plugin(plan.provider)
    assert plan.request.created_at is not None
    expires = planned.plan_expires(plan.request.created_at, plan_ttl)
    tags = stack_tags(plan.spec, plan.bounds.desired, usd_per_hour=plan.usd_per_hour(
        plan.request), user_tags=options.tags)
    stack = ClusterStack.create(plan.request, {**tags, planned.PLANNED_TO: str(out),
                                               planned.PLAN_EXPIRES: expires})
    try:
        return reviewed.save(plan, stack, out, source or {}, expires)
    except BaseException as exc:
        try:
            stack.remove()
        except Exception as cleanup:  # noqa: BLE001 - the first error is the one to report
            exc.add_note(f"the planned stack {plan.stack_name} stayed behind ({cleanup}); "
                         "`skyward-iac gc` removes it once the plan expires")
        raise


def preview(*specs: Spec, options: Options | None = None, hours: float = 1.0,
            on_output: Callable[[str], Any] | None = None, offline: bool | None = None,
            **fields: Any) -> Preview | OfflinePreview:
    """Preview the stack ``sky.Compute(*specs, options=options, **fields)`` would create.

    Runs a real ``pulumi preview`` (nothing is provisioned), then removes the stack. Returns
    the plan and the estimated USD/hour and USD for ``hours`` of the starting nodes, from the
    offer catalog (Local costs 0). Raises ``ConfigError`` for a bad request, before anything
    runs, and ``EngineNotFoundError`` when Local's engine is missing.

    ``offline``: None (default) declares an AWS or GCP pool offline when this machine lacks
    the engine, the provider plugin or credentials, and returns an ``OfflinePreview`` (every
    resource the stack's own program declares, the catalog estimate, no provider diff); True
    always does; False never does (a missing plugin is then an ``EngineNotFoundError``).
    """
    if hours < 0:
        raise ConfigError(f"hours must be >= 0, got {hours}")
    plan = plan_pool(specs, None, options, fields)
    if reason := _offline(plan, offline):
        return preview_offline(plan, hours, reason)
    engine.find_engine()
    require_plugin(plan.provider)
    # Without tags: a stack that is removed again needs none, and each tag is one CLI call.
    stack = ClusterStack.create(plan.request, tags={})
    try:
        planned = stack.preview(on_output=on_output)
    finally:
        stack.remove()
    return Preview(plan=planned, choice=plan.choice, hours=hours)


def _offline(plan: PoolPlan, offline: bool | None) -> str | None:
    """Why ``plan`` is declared offline (see ``preview``), None for a real preview."""
    return None if offline is False else offline_reason(plan.provider, forced=bool(offline))
