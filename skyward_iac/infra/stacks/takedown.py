"""Who may destroy a live stack from outside its pool (``skyward-iac down``), and what the
takedown records: pure functions over the owner's state as gc judges it (``gc.owner_state``,
``gc.lease_reason``: one judgement of leases for every caller).

Without ``--force`` a takedown is refused while the stack's owner may still be using it: its
owner process runs on this machine, its lease from another machine still holds, or its owner
is on another machine with no lease to judge by (``ttl=0``). Forced or not, the destroy's
update message (``pulumi stack history``) and the ``down_by`` tag say who took it down, why.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from skyward_iac.api.deadlines import MAX_CLOCK_SKEW
from skyward_iac.infra.stacks.gc import DEAD, RUNNING


@dataclass(frozen=True, slots=True)
class Holder:
    """What a takedown knows of the stack's owner."""

    owner: str
    host: str
    pid: str
    #: ``gc.owner_state``: running (here), dead (was here) or elsewhere.
    state: str
    #: ``lease_until`` as the owner wrote it ("" without a lease).
    lease_until: str = ""
    #: Why the lease counts as lapsed here (``gc.lease_reason``), None while it holds.
    lease_lapsed: str | None = None
    #: Seconds the lease has left by this machine's clock (for display), None without one.
    lease_left: float | None = None


def refusal(stack: str, holder: Holder) -> str | None:
    """Why ``skyward-iac down STACK`` without ``--force`` must not destroy it, naming the
    owner, its host, the lease left and the command that forces it; None when it may."""
    if holder.state == DEAD:
        return None
    who = f"{holder.owner} (pid {holder.pid or '?'} on {holder.host or '?'})"
    if holder.state == RUNNING:
        why = f"its owner {who} still runs on this machine"
    elif holder.lease_until and holder.lease_lapsed is None:
        left = ("renewed while this machine watched" if holder.lease_left is None
                else f"about {holder.lease_left:.0f}s left by this machine's clock"
                if holder.lease_left >= 0 else
                f"ended {-holder.lease_left:.0f}s ago by this machine's clock, within the "
                f"{MAX_CLOCK_SKEW:g}s allowed for two clocks' difference")
        why = (f"its owner {who} holds a live lease (until {holder.lease_until}, {left}): "
               "the pool is in use")
    elif holder.lease_until:
        return None  # a lapsed lease: its owner stopped renewing it
    else:
        why = (f"its owner {who} is on another machine and the pool has no lease to tell "
               "whether it still runs (ttl=0)")
    force = f"skyward-iac down {shlex.quote(stack)} --force --reason 'WHY'"
    return (f"refused: {stack}: {why}. Close the pool there, or wait until its lease lapses "
            f"(gc collects it then); to take it down anyway: {force}")


def takedown_message(actor: str, forced: bool, reason: str | None) -> str:
    """The destroy's update message and ``down_by`` tag: ``skyward-iac down --force by
    bo@laptop: the job hangs``."""
    said = reason.strip() if reason and reason.strip() else "no reason given"
    return f"skyward-iac down{' --force' if forced else ''} by {actor}: {said}"
