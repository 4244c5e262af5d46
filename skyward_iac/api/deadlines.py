"""Every deadline of a pool's life, as pure functions, each judged on one machine's clock.

The clocks of a pool (docs/lifecycle.md, "Which clock guards what"):

* the **heartbeat**: a node's watchdog notes, on the node's own monotonic clock, when it last
  saw its heartbeat file change, and stops the node after ``ttl`` without a change. The client
  writes a beat; *when* it thinks that happened is never read, so its clock cannot matter;
* the **lease** (``lease_until``): the owner moves it forward while the pool lives; a collector
  on another machine judges it by watching it change on its own monotonic clock, and only a
  first look, which has seen no change yet, compares the owner's time with its own, with
  ``MAX_CLOCK_SKEW`` of slack;
* ``expires_at`` and ``warm_until``: times written by the pool's host, compared exactly on
  that host and with ``MAX_CLOCK_SKEW`` of slack anywhere else;
* ``max_lifetime``: counted by the node from its watchdog's start, on its own clock;
* the **budget** (``Options(max_cost_usd)``): the client integrates what the pool has spent on
  its own monotonic clock; at the current rate that leaves some seconds, a duration it writes
  to each node, whose watchdog counts them down on the node's own clock.

No I/O here: the callers read the clocks and the files, these functions decide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

#: The widest difference between two machines' wall clocks that a comparison across machines
#: tolerates: Kerberos's default (5 minutes), a bound any NTP-kept or even loosely kept clock
#: meets. It only matters where nothing better exists (a collector's first look at a lease).
MAX_CLOCK_SKEW = 300.0
#: The shortest lease: each renewal is one engine command, so not more often than every 10 s.
MIN_LEASE = 30.0


def _at(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")


# ---- the heartbeat, as the client sends it (the client's monotonic clock) --------------------

def beat_interval(ttl: float) -> float:
    """A third of the ttl (so two beats may be lost), between 0.5 and 30 seconds."""
    return min(30.0, max(0.5, ttl / 3))


def beat_timeout(ttl: float) -> float:
    """How long one beat may take before it counts as failed: a beat that hangs must not
    hold the others back for long."""
    return min(10.0, max(1.0, beat_interval(ttl)))


def unreached_too_long(last_beat: float, now: float, ttl: float) -> bool:
    """Whether no beat has reached a node for longer than ``ttl`` (both on the client's
    monotonic clock): the node has stopped itself by now."""
    return now - last_beat > ttl


# ---- the watchdog, as the node judges it (the node's monotonic clock) ------------------------

def watch_interval(ttl: float) -> float:
    """How often a watchdog looks: a quarter of the ttl, between 0.5 and 15 seconds. A beat
    is noticed at most one look late, so a node stops between ``ttl`` and ``ttl`` plus two
    looks after the last beat."""
    return min(15.0, max(0.5, ttl / 4))


@dataclass(frozen=True, slots=True)
class BeatWatch:
    """What a node's watchdog has seen of its heartbeat file, on the node's monotonic clock.

    ``seen`` is the file's last state (any token that changes when the file is written or
    stamped: inode, size, mtime and ctime; None without a file), ``changed_at`` when the
    watchdog saw it change (or started), ``beaten`` whether any beat was seen yet.
    """

    seen: str | None
    changed_at: float
    beaten: bool = False


def start_watch(seen: str | None, now: float) -> BeatWatch:
    """The watch of a watchdog starting ``now``: what is there already is no beat."""
    return BeatWatch(seen, now, False)


def observe_beat(watch: BeatWatch, seen: str | None, now: float) -> BeatWatch:
    """The watch after looking at the heartbeat file ``now``: any change of its state is a
    beat, whatever times the file carries (a file that disappeared is not one)."""
    if seen == watch.seen:
        return watch
    if seen is None:
        return replace(watch, seen=None)
    return BeatWatch(seen, now, True)


def silence_allowed(ttl: float, first_contact: float, beaten: bool) -> float:
    """How long a node may go without a beat: ``ttl``, or before its first beat (the client
    is still bringing the pool up) at least ``first_contact``."""
    return ttl if beaten else max(ttl, first_contact)


def watchdog_stop_reason(watch: BeatWatch, now: float, *, started: float, ttl: float,
                         first_contact: float = 0.0, max_lifetime: float | None = None,
                         budget_end: float | None = None) -> str | None:
    """Why the node must stop now (no beat seen for its allowed silence, older than
    ``max_lifetime`` counted from the watchdog's start, or past ``budget_end``, the budget's
    deadline on this node's clock), or None while it may live on. ``ttl`` 0: the heartbeat
    does not matter."""
    silence = now - watch.changed_at
    if ttl and silence > silence_allowed(ttl, first_contact, watch.beaten):
        what = "heartbeat" if watch.beaten else "first heartbeat"
        return f"no {what} seen for {silence:.0f}s (ttl {ttl:g}s)"
    if max_lifetime and now - started > max_lifetime:
        return f"it reached its max_lifetime of {max_lifetime:g}s"
    if budget_end is not None and now >= budget_end:
        return "the deadline of its pool's budget (Options(max_cost_usd)) passed"
    return None


# ---- the budget, as the client counts it (its monotonic clock) -------------------------------

#: The share of the budget at which the client warns (an event and a console line).
BUDGET_WARNING = 0.8
#: The file in a node's workdir where the client writes the seconds its budget leaves.
BUDGET_FILE = "budget"


def seconds_until_spent(target_usd: float, spent_usd: float, usd_per_hour: float) -> float | None:
    """Seconds until a pool that has spent ``spent_usd`` reaches ``target_usd`` at
    ``usd_per_hour`` (0 when it has already), or None when it never does at that rate."""
    if spent_usd >= target_usd:
        return 0.0
    if usd_per_hour <= 0:
        return None
    return (target_usd - spent_usd) / usd_per_hour * 3600


def budget_note(seconds_left: float | None) -> str:
    """What the client writes to a node's ``BUDGET_FILE``: whole seconds, rounded up (the node
    must never stop before its client closes the pool), or ``none`` for no deadline (no budget,
    or nodes that cost nothing). A duration, never a time: the node counts it on its clock."""
    if seconds_left is None:
        return "none\n"
    return f"{math.ceil(max(0.0, seconds_left))}\n"


# ---- the budget, as the node judges it (the node's monotonic clock) ----------------------------

def read_budget_note(note: str, now: float, previous: float | None) -> float | None:
    """The budget's deadline on the node's clock once it read ``note`` (its budget file, seen
    changed) at ``now``: that many seconds from now, or None for ``none``. Anything else (a
    file caught half written) keeps ``previous``: the next change is read again."""
    text = note.strip()
    if text == "none":
        return None
    try:
        seconds = float(text)
    except ValueError:
        return previous
    if not math.isfinite(seconds) or seconds < 0:
        return previous
    return now + seconds


def next_look(interval: float, now: float, budget_end: float | None) -> float:
    """How long the watchdog sleeps before its next look: ``interval``, or less when the
    budget's deadline comes sooner (the node stops on time, not a look late)."""
    if budget_end is None:
        return interval
    return max(0.05, min(interval, budget_end - now))


# ---- the lease, as the owner writes it (the owner's wall clock) -------------------------------

def lease_seconds(ttl: float) -> float:
    """How long one renewal keeps the stack: its ttl, at least ``MIN_LEASE``."""
    return max(float(ttl), MIN_LEASE)


def renew_interval(ttl: float) -> float:
    """How often the owner renews: a third of the lease (two renewals may fail)."""
    return lease_seconds(ttl) / 3


def lease_end(ttl: float, now: datetime, previous: str | None = None) -> str:
    """The ``lease_until`` a renewal at ``now`` writes: a lease later, and always later than
    the ``previous`` one, so that every renewal is a change a collector can see (even after
    the owner's clock stepped back)."""
    moment = (now + timedelta(seconds=lease_seconds(ttl))).replace(microsecond=0)
    if previous is not None and moment <= _at(previous):
        moment = _at(previous) + timedelta(seconds=1)
    return _iso(moment)


# ---- the lease, as a collector judges it (the collector's monotonic clock) ---------------------

@dataclass(frozen=True, slots=True)
class LeaseSighting:
    """A lease value as one collector saw it: first seen at ``seen_at`` on its monotonic
    clock during boot ``boot`` (the clock restarts with each boot); ``renewed`` once this
    collector has seen the value change, i.e. watched a renewal happen."""

    value: str
    seen_at: float
    boot: str
    renewed: bool = False


def sight_lease(previous: LeaseSighting | None, value: str, now: float,
                boot: str) -> LeaseSighting:
    """The sighting after reading ``value`` at ``now``; an unchanged value keeps its first
    sighting (its age is how long this collector has seen no renewal)."""
    if previous is not None and previous.boot == boot and previous.value == value:
        return previous
    return LeaseSighting(value, now, boot,
                         renewed=previous is not None and previous.boot == boot)


def lease_lapsed(until: str, ttl: float, now: datetime, sighting: LeaseSighting,
                 mono_now: float) -> str | None:
    """Why a lease from another machine counts as lapsed, or None while it holds.

    Lapsed when this collector has seen it unchanged for longer than the lease (on its own
    clock: no skew matters). A lease seen renewed is held until then, whatever the clocks
    say. Only a first look, with no renewal seen yet, compares the owner's time with this
    machine's, and allows ``MAX_CLOCK_SKEW`` on top.
    """
    lease = lease_seconds(ttl)
    unchanged = mono_now - sighting.seen_at
    if unchanged > lease:
        return (f"its lease lapsed: unrenewed for {unchanged:.0f}s by this machine's clock "
                f"(lease {lease:g}s, last until {until})")
    if sighting.renewed:
        return None
    if now > _at(until) + timedelta(seconds=MAX_CLOCK_SKEW):
        return (f"its lease lapsed at {until}, more than {MAX_CLOCK_SKEW:g}s ago by this "
                "machine's clock")
    return None


# ---- expiry and warm time, written by the pool's host ----------------------------------------

def expires_at(created: datetime, ttl: float) -> str:
    """The ``expires_at`` tag: when a client dead at creation has left nothing running
    (``never`` without a ttl)."""
    return _iso(created + timedelta(seconds=ttl)) if ttl else "never"


def wall_passed(deadline: str, now: datetime, same_clock: bool) -> bool:
    """Whether ``deadline`` (ISO, or ``never``), written by some machine, has passed at
    ``now`` on this one: exactly when it is the same machine, else only ``MAX_CLOCK_SKEW``
    after it."""
    if deadline == "never":
        return False
    slack = timedelta(seconds=0 if same_clock else MAX_CLOCK_SKEW)
    return _at(deadline) + slack <= now


def warm_until(now: float, keep_warm: float) -> float:
    """Until when a keeper keeps a warm pool (a time on its host's clock, which writes it)."""
    return now + keep_warm


def seconds_left(deadline: str | None, now: datetime) -> float | None:
    """Seconds from ``now`` to ``deadline`` (negative: passed), for display on the machine
    whose clock wrote it; None without one."""
    try:
        return round((_at(deadline) - now).total_seconds(), 1) if deadline else None
    except ValueError:
        return None
