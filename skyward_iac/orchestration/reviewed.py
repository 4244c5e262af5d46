"""Reviewed plans: ``skyward-iac plan`` saves what a pool's stack will do; a pool started with
``Options(plan=...)`` brings up exactly that stack, under ``pulumi up --plan``.

The plan file (JSON) holds the stack's name and frozen creation time, the facts the stack's
declaration depends on (spec, offer, sizes, lifetime, tags), the estimated USD/hour and the
engine's own update plan (``pulumi preview --save-plan``). A pool whose facts differ from the
saved ones is refused before anything is created, naming each difference; the engine itself
refuses an update that strays from its plan.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyward_iac.api.errors import ConfigError
from skyward_iac.infra import home

if TYPE_CHECKING:
    from skyward_iac.infra.stack import ClusterStack, Plan
    from skyward_iac.orchestration.plan import PoolPlan

PLAN_FORMAT = 1
#: Image fields whose values may be secrets (``HF_TOKEN``): compared by digest.
SECRET_VALUED = ("env", "shell_vars")


@dataclass(frozen=True, slots=True)
class ReviewedPlan:
    """A saved plan: the stack it was made for and what it was made from."""

    path: Path
    stack: str
    created_at: datetime
    facts: dict[str, Any]
    usd_per_hour: float
    #: The engine's update plan, as ``pulumi preview --save-plan`` wrote it.
    engine_plan: dict[str, Any]
    #: What the pool was described by, in text (``skyward-iac apply`` rebuilds it from this):
    #: ``{"pool": NAME}`` or ``{"provider": P, "settings": {...}}`` (the CLI's flags).
    source: dict[str, Any] = field(default_factory=dict)

    def engine_plan_file(self) -> Path:
        """The engine's plan as a file of its own (``pulumi up --plan`` reads a path)."""
        target = home.skyward_home() / "plans" / f"{self.stack}.json"
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        target.write_text(json.dumps(self.engine_plan))
        target.chmod(0o600)
        return target


def plan_facts(plan: PoolPlan) -> dict[str, Any]:
    """What the pool's stack declaration depends on, as JSON values (not the stack's name or
    creation time, which the reviewed plan fixes)."""
    request = plan.request
    spec = json.loads(plan.spec.model_dump_json(exclude={"plugins"}))
    image = spec.get("image", {})
    for key in SECRET_VALUED:  # tokens live there: the file keeps digests, never values
        image[key] = {name: _digest(value) for name, value in (image.get(key) or {}).items()}
    return {
        "spec": spec,
        "plugins": [getattr(p, "name", repr(p)) for p in plan.spec.plugins],
        "offer": None if plan.provider == "local" else {
            "instance_type": plan.choice.offer.instance_type,
            "region": plan.choice.offer.region, "market": plan.choice.market},
        "nodes": request.node_count,
        "max_nodes": request.max_nodes,
        "max_lifetime": request.max_lifetime,
        "collections": request.collections,
        "tags": dict(request.tags),
    }


def _digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(str(value).encode()).hexdigest()[:16]


def differences(saved: Any, now: Any, where: str = "") -> list[str]:
    """Each place where ``now`` differs from ``saved``: ``spec.nodes.desired: 2 -> 3``."""
    if isinstance(saved, dict) and isinstance(now, dict):
        return [line for key in sorted(set(saved) | set(now), key=str)
                for line in differences(saved.get(key), now.get(key),
                                        f"{where}.{key}" if where else str(key))]
    return [] if saved == now else [f"{where}: {saved!r} -> {now!r}"]


def save(plan: PoolPlan, stack: ClusterStack, out: Path, source: dict[str, Any],
         on_output: Any = None) -> tuple[Plan, ReviewedPlan]:
    """Preview ``plan``'s (created, empty) stack with an update plan and write the plan file."""
    engine_file = out.with_name(out.name + ".engine")
    planned = stack.preview(on_output=on_output, save_plan=engine_file)
    try:
        engine_plan = json.loads(engine_file.read_text())
    finally:
        engine_file.unlink(missing_ok=True)
    assert plan.request.created_at is not None
    reviewed = ReviewedPlan(path=out, stack=plan.stack_name, created_at=plan.request.created_at,
                            facts=plan_facts(plan), usd_per_hour=plan.usd_per_hour(plan.request),
                            engine_plan=engine_plan, source=source)
    out.write_text(json.dumps({
        "skyward_plan": PLAN_FORMAT, "stack": reviewed.stack,
        "created_at": reviewed.created_at.isoformat(), "usd_per_hour": reviewed.usd_per_hour,
        "source": source, "facts": reviewed.facts, "resources": [asdict(r) for r in planned.resources],
        "engine_plan": engine_plan,
    }, indent=2, default=str) + "\n")
    return planned, reviewed


def load(path: str | Path) -> ReviewedPlan:
    """Read a plan file; a missing or foreign file is a ``ConfigError``."""
    path = Path(path).expanduser()
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"Options(plan={str(path)!r}): cannot read the plan: {exc}") from None
    if not isinstance(document, dict) or document.get("skyward_plan") != PLAN_FORMAT:
        raise ConfigError(f"{path} is not a plan written by `skyward-iac plan`")
    return ReviewedPlan(path=path, stack=document["stack"],
                        created_at=datetime.fromisoformat(document["created_at"]),
                        facts=document["facts"], usd_per_hour=document["usd_per_hour"],
                        engine_plan=document["engine_plan"],
                        source=document.get("source") or {})


def take(reviewed: ReviewedPlan, tags: dict[str, str]) -> ClusterStack:
    """The reviewed stack, made this pool's (its tags name the applier as owner) and bound
    to the engine's plan for its first ``up``; refused if it was applied already."""
    from skyward_iac.infra.stack import ClusterStack

    stack = ClusterStack.select(reviewed.stack)
    if stack.resource_count() or any(update.kind == "update" for update in stack.history()):
        raise ConfigError(f"the reviewed plan {reviewed.path} was applied already (stack "
                          f"{reviewed.stack} has run); a plan is applied once: make a new one")
    stack.update_tags({**tags, "reviewed_plan": str(reviewed.path)})
    stack.plan_file = reviewed.engine_plan_file()
    return stack


def bind(plan: PoolPlan, reviewed: ReviewedPlan) -> PoolPlan:
    """``plan`` as the reviewed one: its stack and creation time; ``ConfigError`` naming every
    difference when the pool asked for is not the pool that was reviewed."""
    if changed := differences(reviewed.facts, plan_facts(plan)):
        raise ConfigError(
            f"the pool does not match the reviewed plan {reviewed.path} (stack "
            f"{reviewed.stack}); nothing was created. Differences (planned -> now):\n  "
            + "\n  ".join(changed) + "\nMake a new plan with `skyward-iac plan`, or ask for "
            "the pool that was reviewed.")
    request = replace(plan.request, stack_name=reviewed.stack, created_at=reviewed.created_at)
    return replace(plan, stack_name=reviewed.stack, request=request, run_id=reviewed.stack,
                   reviewed=reviewed)
