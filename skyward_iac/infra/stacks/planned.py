"""Planned stacks: the empty stack ``skyward-iac plan`` creates for a reviewed plan, its tags,
and when gc removes it (pure; ``gc.py`` acts on it).

A plan nobody applied expires ``plan_ttl`` seconds after it was made (``PLAN_EXPIRES``, on
the planner's clock). Whoever enforces the expiry (gc, an applier) judges it on its own clock
with ``deadlines.wall_passed``: exactly on the planner's host, and only ``MAX_CLOCK_SKEW``
later on any other machine.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from skyward_iac.api.deadlines import wall_passed
from skyward_iac.infra.stacks.tags import StackRecord

#: Where ``skyward-iac plan`` wrote the plan (set on the planned stack).
PLANNED_TO = "planned_to"
#: When an unapplied plan expires (ISO 8601, UTC).
PLAN_EXPIRES = "plan_expires"
#: Set (to the applier's mark) before a plan's first ``up``: a plan is applied once.
PLAN_APPLIED = "plan_applied"
#: How long a plan may wait for its apply unless ``skyward-iac plan --plan-ttl`` says.
DEFAULT_PLAN_TTL = 24 * 3600


def plan_expires(created_at: datetime, plan_ttl: float) -> str:
    """The ``PLAN_EXPIRES`` value of a plan made at ``created_at``."""
    return (created_at + timedelta(seconds=plan_ttl)).isoformat(timespec="seconds")


def plan_expired(expires_at: str, now: datetime, same_host: bool) -> bool:
    """Whether a plan that expires at ``expires_at`` has, at ``now`` on this machine, which is
    (``same_host``) or is not the one that made the plan."""
    return wall_passed(expires_at, now, same_clock=same_host)


def expired_plan_reason(record: StackRecord, now: datetime, host: str) -> str | None:
    """Why gc on ``host`` removes ``record`` now (an unapplied plan's stack past its expiry),
    or None."""
    tags = record.tags
    if record.resource_count or PLANNED_TO not in tags or tags.get(PLAN_APPLIED):
        return None
    expires = tags.get(PLAN_EXPIRES)
    if not expires and "created_at" in tags:  # a plan made before plans expired
        expires = plan_expires(datetime.fromisoformat(tags["created_at"]), DEFAULT_PLAN_TTL)
    if not expires or not plan_expired(expires, now, same_host=tags.get("host") == host):
        return None
    return (f"a plan nobody applied (by {tags.get('owner', '?')}, written to "
            f"{tags[PLANNED_TO]}) expired at {expires}")
