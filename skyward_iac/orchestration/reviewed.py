"""Reviewed plans: ``skyward-iac plan`` saves what a pool's stack will do; a pool started with
``Options(plan=...)`` (or ``skyward-iac apply``) brings up exactly that stack, once, under
``pulumi up --plan``.

The plan file (``plan_file.py`` has its format) is sealed by a digest over everything in it.
Before anything is created a pool checks, in this order: the digest (an edited file is
refused; ``apply --approved`` also compares it with the approved one), the plan's expiry, and
that the pool asked for has the reviewed facts. Then it claims the stack: a plan is applied
once, and of two appliers racing, the one whose ``up`` reached the backend first keeps it.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import logging
import os
import secrets
import socket
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyward_iac.api.errors import ConfigError, StackNotFoundError
from skyward_iac.infra.stacks import home
from skyward_iac.infra.stacks.planned import PLAN_APPLIED, plan_expired
from skyward_iac.infra.stacks.stack import ClusterStack
from skyward_iac.orchestration import plan_file

if TYPE_CHECKING:
    from skyward_iac.infra.stacks.stack import Plan
    from skyward_iac.orchestration.plan import PoolPlan
    from skyward_iac.outputs import ClusterOutputs

log = logging.getLogger("skyward")
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
    #: ``sha256:...`` over the whole file (``plan_file.digest``).
    digest: str = ""
    #: When the plan expires unapplied (ISO 8601, the planner's clock).
    expires_at: str = ""

    def engine_plan_file(self) -> Path:
        """The engine's plan as a file of its own (``pulumi up --plan`` reads a path)."""
        target = home.skyward_home() / "plans" / f"{self.stack}.json"
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_whole(target, json.dumps(self.engine_plan), 0o600)
        return target


def write_whole(path: Path, text: str, mode: int = 0o666) -> None:
    """Write ``text`` to ``path`` whole or not at all (a failure leaves no half file); ``mode``
    before the umask."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


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
        "offer": None if plan.spec.provider.on_this_machine else {
            "instance_type": plan.choice.offer.instance_type,
            "region": plan.choice.offer.region, "market": plan.choice.market},
        "nodes": request.node_count,
        "max_nodes": request.max_nodes,
        "max_lifetime": request.max_lifetime,
        "max_cost_usd": plan.options.max_cost_usd,
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


def budget_difference(reviewed: float | None, asked: float | None) -> list[str]:
    """The reviewed budget bounds whoever applies the plan: the same budget or a smaller
    one passes, a larger one or none is a difference."""
    if reviewed is None or (asked is not None and asked <= reviewed):
        return []
    return [f"max_cost_usd: {reviewed!r} -> {asked!r} (the reviewed budget is the most the "
            "pool may spend: ask for it or less)"]


def save(plan: PoolPlan, stack: ClusterStack, out: Path, source: dict[str, Any],
         expires_at: str, on_output: Any = None) -> tuple[Plan, ReviewedPlan]:
    """Preview ``plan``'s (created, empty) stack with an update plan and write the sealed plan
    file to ``out`` (an absolute path: the engine runs in a directory of its own)."""
    engine_file = home.skyward_home() / "plans" / f"{plan.stack_name}.engine.json"
    engine_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        planned = stack.preview(on_output=on_output, save_plan=engine_file)
        engine_plan = json.loads(engine_file.read_text())
    finally:
        engine_file.unlink(missing_ok=True)
    assert plan.request.created_at is not None
    stored, stackless = plan_file.stackless(engine_plan, plan.stack_name)
    document: dict[str, Any] = {
        "skyward_plan": plan_file.PLAN_FORMAT, "digest": "", "stack": plan.stack_name,
        "created_at": plan.request.created_at.isoformat(), "expires_at": expires_at,
        "planned_on": socket.gethostname(),
        "usd_per_hour": plan.usd_per_hour(plan.request), "source": source,
        "facts": plan_facts(plan), "resources": plan_file.resources_by_name(planned.resources),
        "engine_plan_stackless": stackless, "engine_plan": stored,
    }
    document = json.loads(json.dumps(document, default=str))  # the JSON values, as re-read
    document["digest"] = plan_file.digest(document)
    # A plan holds no secret (digests and ciphertext only): reviewers read it.
    write_whole(out, json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    return planned, _reviewed(out, document)


def load(path: str | Path, approved: str | None = None,
         now: datetime | None = None) -> ReviewedPlan:
    """Read a plan file and check its seal: ``ConfigError`` for a missing or foreign file, an
    edited one (its content no longer has its digest), one that is not the ``approved``
    digest, and an expired one (judged on this machine's clock: exactly on the planner's host,
    ``MAX_CLOCK_SKEW`` later elsewhere)."""
    path = Path(os.path.abspath(Path(path).expanduser()))
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"Options(plan={str(path)!r}): cannot read the plan: {exc}") from None
    if not isinstance(document, dict) or "skyward_plan" not in document:
        raise ConfigError(f"{path} is not a plan written by `skyward-iac plan`")
    if document["skyward_plan"] != plan_file.PLAN_FORMAT:
        raise ConfigError(f"{path} was written by another version of skyward_iac (plan format "
                          f"{document['skyward_plan']!r}, this one reads "
                          f"{plan_file.PLAN_FORMAT}); make a new plan with `skyward-iac plan`")
    actual = plan_file.digest(document)
    if document.get("digest") != actual:
        raise ConfigError(
            f"{path} was changed after `skyward-iac plan` sealed it: its content has digest "
            f"{actual}, not the {document.get('digest')!r} it was written with. Nothing was "
            "created. Review and apply an unedited plan, or make a new one.")
    if document.get("offline"):  # offline_preview.save_offline_plan: no engine plan, no stack
        raise ConfigError(
            f"{path} is an offline plan (offline: no provider diff), made where the provider "
            "plugin or credentials were missing: it is for review and cannot be applied. "
            "Nothing was created. Make the plan to apply with `skyward-iac plan` where the "
            "provider plugin and credentials are.")
    if approved is not None and not plan_file.same_digest(approved, actual):
        raise ConfigError(
            f"{path} is not the approved plan: its digest is {actual}, the approved one "
            f"{approved}. Nothing was created. Apply the file that was reviewed.")
    reviewed = _reviewed(path, document)
    same_host = document.get("planned_on") == socket.gethostname()
    if plan_expired(reviewed.expires_at, now or datetime.now(UTC), same_host):
        raise ConfigError(
            f"the plan {path} (stack {reviewed.stack}) expired at {reviewed.expires_at} "
            "unapplied; nothing was created. Make a new plan with `skyward-iac plan` (gc "
            "removes the expired plan's stack).")
    return reviewed


def _reviewed(path: Path, document: dict[str, Any]) -> ReviewedPlan:
    try:
        return ReviewedPlan(
            path=path, stack=document["stack"],
            created_at=datetime.fromisoformat(document["created_at"]),
            facts=document["facts"], usd_per_hour=document["usd_per_hour"],
            engine_plan=plan_file.with_stack(document["engine_plan"], document["stack"],
                                             document["engine_plan_stackless"]),
            source=document.get("source") or {}, digest=document["digest"],
            expires_at=document["expires_at"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path} is not a plan written by `skyward-iac plan` ({exc!r} "
                          "missing or malformed)") from None


class ReviewedStack(ClusterStack):
    """A reviewed plan's stack as one applier holds it: its first ``up`` runs under the
    engine's plan with the applier's mark in the update's message; it destroys the stack only
    when that first update was its own (a loser of a race leaves the winner's pool alone)."""

    mark: str = ""
    digest: str = ""
    _owned: bool = False

    def up(self, *args: Any, **kwargs: Any) -> ClusterOutputs:
        first = self.plan_file is not None
        if first:
            kwargs["message"] = f"skyward: reviewed plan {self.digest} applied by {self.mark}"
        outputs = super().up(*args, **kwargs)
        if first and not self.owned():
            raise ConfigError(
                f"the reviewed plan of stack {self.name} was applied at the same time by "
                f"{self.applied_by()}; that pool runs it, this one stops (it destroys nothing)")
        return outputs

    def owned(self) -> bool:
        """Whether this applier's update is the stack's first (read once it is)."""
        if not self._owned:
            first = self.applied_by()
            self._owned = first is not None and self.mark in first
        return self._owned

    def applied_by(self) -> str | None:
        """The message of the stack's first update (it names its applier), None before any."""
        return plan_file.first_applier((u.kind, u.message or "") for u in self.history())

    def destroy(self, *args: Any, **kwargs: Any) -> None:
        if self.owned():
            super().destroy(*args, **kwargs)
        else:
            log.warning("stack %s: not destroyed by this pool, which did not apply its plan "
                        "(first update: %s)", self.name, self.applied_by())


def take(reviewed: ReviewedPlan, tags: dict[str, str]) -> ClusterStack:
    """The reviewed stack, claimed by this pool (its tags name the applier as owner and mark
    the plan applied) and bound to the engine's plan for its first ``up``; ``ConfigError`` if
    the plan was applied already or its stack is gone."""
    try:
        stack = ReviewedStack.select(reviewed.stack)
    except StackNotFoundError as exc:
        raise ConfigError(f"the stack of the reviewed plan {reviewed.path} is gone: {exc} "
                          "(gc removes the stack of an expired plan); make a new plan") from None
    assert isinstance(stack, ReviewedStack)
    if applied := stack.tags().get(PLAN_APPLIED):
        failed = [u for u in stack.history() if u.kind == "update"][-1:]
        if failed and failed[0].result == "failed":
            raise ConfigError(f"the reviewed plan {reviewed.path} was applied already by "
                              f"{applied}, and that update failed (stack {reviewed.stack}; "
                              "`skyward-iac history --json` says why); a plan is tried once: "
                              "make a new one")
        raise ConfigError(f"the reviewed plan {reviewed.path} was applied already (stack "
                          f"{reviewed.stack}, by {applied}); a plan is applied once: make a "
                          "new one")
    actor = f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"
    stack.mark = plan_file.applier_mark(actor, secrets.token_hex(6))
    stack.digest = reviewed.digest
    stack.update_tags({**tags, "reviewed_plan": reviewed.digest, PLAN_APPLIED: stack.mark})
    if (claimed := stack.tags().get(PLAN_APPLIED)) != stack.mark:
        raise ConfigError(f"the reviewed plan {reviewed.path} is being applied by {claimed}; "
                          "a plan is applied once")
    stack.plan_file = reviewed.engine_plan_file()
    return stack


def bind(plan: PoolPlan, reviewed: ReviewedPlan) -> PoolPlan:
    """``plan`` as the reviewed one: its stack and creation time; ``ConfigError`` naming every
    difference when the pool asked for is not the pool that was reviewed."""
    here = (str(home.local_nodes_dir()), getpass.getuser())
    if elsewhere := plan_file.local_node_owners(reviewed.engine_plan) - {here}:
        where, user = min(elsewhere)
        raise ConfigError(
            f"the Local plan {reviewed.path} runs its nodes as {user} under {where}, where it "
            f"was made; here they would run as {here[1]} under {here[0]}. Apply it there (the "
            "same user and skyward home), or make a new plan here; nothing was created.")
    saved, asked = dict(reviewed.facts), plan_facts(plan)
    budget = budget_difference(saved.pop("max_cost_usd", None), asked.pop("max_cost_usd"))
    if changed := differences(saved, asked) + budget:
        raise ConfigError(
            f"the pool does not match the reviewed plan {reviewed.path} (stack "
            f"{reviewed.stack}); nothing was created. Differences (planned -> now):\n  "
            + "\n  ".join(changed) + "\nMake a new plan with `skyward-iac plan`, or ask for "
            "the pool that was reviewed.")
    request = replace(plan.request, stack_name=reviewed.stack, created_at=reviewed.created_at)
    return replace(plan, stack_name=reviewed.stack, request=request, run_id=reviewed.stack,
                   reviewed=reviewed)
