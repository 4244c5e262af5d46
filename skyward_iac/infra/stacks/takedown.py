"""Who may destroy a stack, and what its destroy records: pure functions over the owner as this
machine judges it (``owners.py``: one judgement of owners and leases for every caller).

Every destroyer goes through ``destroy.py`` and this policy. Its owner's own processes (the
pool's exit, the warm pool's keeper) hold the stack and may always destroy it. Anyone else
(``skyward-iac down``, gc, a dead kernel's reaper) is refused, unless ``--force``, while the
owner may still use the stack: a process of this machine holds it, a keeper keeps it warm,
its lease from another machine still holds, or its owner is on another machine with no lease
to judge by (``ttl=0``) and no expiry passed.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from skyward_iac.api.deadlines import MAX_CLOCK_SKEW, seconds_left, wall_passed
from skyward_iac.infra.stacks.leases import LEASE_UNTIL
from skyward_iac.infra.stacks.owners import (
    DEAD,
    ELSEWHERE,
    RUNNING,
    Look,
    lease_reason,
    owner_state,
)
from skyward_iac.infra.stacks.tags import WARM_UNTIL, StackRecord


@dataclass(frozen=True, slots=True)
class Holder:
    """What a destroyer knows of the stack's owner."""

    owner: str
    host: str
    pid: str
    #: ``owners.owner_state``: running (here), dead (was here) or elsewhere.
    state: str
    #: ``lease_until`` as the owner wrote it ("" without a lease).
    lease_until: str = ""
    #: Why the lease counts as lapsed here (``owners.lease_reason``), None while it holds.
    lease_lapsed: str | None = None
    #: Seconds the lease has left by this machine's clock (for display), None without one.
    lease_left: float | None = None
    #: Until when a keeper keeps the stack's nodes warm ("" when not, or no longer here).
    warm_until: str = ""
    #: Whether the stack's ``expires_at`` has passed as this machine judges it.
    expired: bool = False


def holder_of(record: StackRecord, look: Look) -> Holder:
    """The owner of ``record`` as ``look`` sees it."""
    tags = record.tags
    state = owner_state(record, look)
    same_clock = state != ELSEWHERE
    warm = tags.get(WARM_UNTIL, "")
    return Holder(
        owner=tags.get("owner", "?"), host=tags.get("host", ""), pid=tags.get("pid", ""),
        state=state, lease_until=tags.get(LEASE_UNTIL, ""),
        lease_lapsed=lease_reason(record, look),
        lease_left=seconds_left(tags.get(LEASE_UNTIL), look.now),
        warm_until=warm if warm and not wall_passed(warm, look.now, same_clock) else "",
        expired=wall_passed(tags.get("expires_at", "never"), look.now, same_clock))


def refusal(stack: str, holder: Holder, *, force: bool = False, holds: bool = False) -> str | None:
    """Why a destroy of ``stack`` must not go ahead, naming the owner, its host, the lease
    left and the command that forces it; None when it may: forced, asked by a process that
    holds the stack (``holds``), or its owner can no longer be using it."""
    if force or holds or holder.state == DEAD:
        return None
    who = f"{holder.owner} (pid {holder.pid or '?'} on {holder.host or '?'})"
    if holder.state == RUNNING:
        why = f"its owner {who} still runs on this machine"
    elif holder.warm_until:
        why = (f"the warm pool of {who} is kept for its next user until {holder.warm_until} "
               "(its keeper destroys it then)")
    elif holder.lease_until and holder.lease_lapsed is None:
        left = ("renewed while this machine watched" if holder.lease_left is None
                else f"about {holder.lease_left:.0f}s left by this machine's clock"
                if holder.lease_left >= 0 else
                f"ended {-holder.lease_left:.0f}s ago by this machine's clock, within the "
                f"{MAX_CLOCK_SKEW:g}s allowed for two clocks' difference")
        why = (f"its owner {who} holds a live lease (until {holder.lease_until}, {left}): "
               "the pool is in use")
    elif holder.lease_until or holder.expired:
        return None  # a lapsed lease (its owner stopped renewing it), or expired
    else:
        why = (f"its owner {who} is on another machine and the pool has no lease to tell "
               "whether it still runs (ttl=0)")
    force_it = f"skyward-iac down {shlex.quote(stack)} --force --reason 'WHY'"
    return (f"refused: {stack}: {why}. Close the pool there, or wait until its lease lapses "
            f"(gc collects it then); to take it down anyway: {force_it}")


def destroy_message(actor: str, reason: str) -> str:
    """The destroy's Pulumi update message (``pulumi stack history`` shows it): ``skyward:
    destroyed by ana@box: pool closed``."""
    return f"skyward: destroyed by {actor}: {reason}"


def down_reason(forced: bool, reason: str | None) -> str:
    """Why ``skyward-iac down`` destroys: ``skyward-iac down --force: the job hangs``."""
    said = reason.strip() if reason and reason.strip() else "no reason given"
    return f"skyward-iac down{' --force' if forced else ''}: {said}"
