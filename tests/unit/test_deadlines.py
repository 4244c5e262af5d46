"""The deadline module, pure: each decision on one machine's clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from skyward_iac.api.deadlines import (
    MAX_CLOCK_SKEW,
    MIN_LEASE,
    LeaseSighting,
    beat_interval,
    beat_timeout,
    expires_at,
    lease_end,
    lease_lapsed,
    lease_seconds,
    observe_beat,
    renew_interval,
    seconds_left,
    sight_lease,
    silence_allowed,
    start_watch,
    unreached_too_long,
    wall_passed,
    warm_until,
    watch_interval,
    watchdog_stop_reason,
)

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)


def iso(seconds: float) -> str:
    return (NOW + timedelta(seconds=seconds)).isoformat(timespec="seconds")


# ---- heartbeat and watchdog ------------------------------------------------------------------

def test_beat_and_watch_timing() -> None:
    assert (beat_interval(600), beat_interval(6), beat_interval(1)) == (30, 2, 0.5)
    assert (beat_timeout(600), beat_timeout(3)) == (10, 1)
    assert (watch_interval(600), watch_interval(6), watch_interval(1)) == (15, 1.5, 0.5)
    assert unreached_too_long(0.0, 31.0, 30) and not unreached_too_long(0.0, 30.0, 30)


def test_a_beat_is_a_change_never_a_time() -> None:
    watch = start_watch("ino:1:mtime-a:ctime-a", now=100.0)
    assert not watch.beaten and watch.changed_at == 100.0
    same = observe_beat(watch, "ino:1:mtime-a:ctime-a", now=120.0)
    assert same == watch  # nothing changed: silence goes on counting from 100
    beat = observe_beat(same, "ino:1:mtime-a:ctime-b", now=121.0)  # an mtime 120 s behind
    assert beat.beaten and beat.changed_at == 121.0
    gone = observe_beat(beat, None, now=130.0)  # the file was deleted: no beat
    assert gone.changed_at == 121.0 and gone.seen is None
    back = observe_beat(gone, "ino:2:x:y", now=131.0)
    assert back.changed_at == 131.0


def test_the_watchdog_fires_after_ttl_of_its_own_silence_only() -> None:
    started = 1000.0
    watch = observe_beat(start_watch(None, started), "t1", started + 5)

    def reason(now: float, w=watch) -> str | None:  # type: ignore[no-untyped-def]
        return watchdog_stop_reason(w, now, started=started, ttl=30, first_contact=900)

    assert reason(started + 5 + 30) is None
    assert "no heartbeat seen for 31s" in (reason(started + 5 + 31) or "")
    # Before the first beat: the first-contact grace, counted from the watchdog's start.
    fresh = start_watch(None, started)
    assert silence_allowed(30, 900, beaten=False) == 900 and silence_allowed(30, 10, False) == 30
    assert watchdog_stop_reason(fresh, started + 899, started=started, ttl=30,
                                first_contact=900) is None
    assert "first heartbeat" in (watchdog_stop_reason(fresh, started + 901, started=started,
                                                      ttl=30, first_contact=900) or "")


@pytest.mark.parametrize("stamp_skew", [-120.0, 0.0, 120.0])
def test_a_client_clock_off_either_way_changes_nothing(stamp_skew: float) -> None:
    """Beats every 10 s stamped with a client clock ``stamp_skew`` off, then none: the node
    lives while they come and stops ttl after the last, the same for every skew."""
    started, ttl, client = 0.0, 30.0, 1_000_000.0
    watch = start_watch(None, started)
    fired = None
    for tick in range(1, 200):
        now = started + tick * 2.0  # the watchdog looks every 2 s
        if now <= 60:  # the client beats for a minute, with its own (wrong) times
            stamp = client + stamp_skew + now // 10 * 10
            watch = observe_beat(watch, f"ino:8:{stamp}:{now // 10}", now)
        if watchdog_stop_reason(watch, now, started=started, ttl=ttl) and fired is None:
            fired = now
    assert fired is not None and 60 + ttl < fired <= 60 + ttl + 2 * 2.0


# ---- leases ------------------------------------------------------------------------------------

def test_lease_timing() -> None:
    assert lease_seconds(600) == 600 and renew_interval(600) == 200
    assert lease_seconds(6) == MIN_LEASE and renew_interval(6) == MIN_LEASE / 3
    assert lease_end(600, NOW) == iso(600)


def test_every_renewal_writes_a_new_value_even_after_a_clock_step_back() -> None:
    first = lease_end(30, NOW)
    assert lease_end(30, NOW, previous=first) == iso(31)
    assert lease_end(30, NOW - timedelta(hours=1), previous=first) == iso(31)
    assert lease_end(30, NOW + timedelta(seconds=10), previous=first) == iso(40)


def test_sighting_counts_from_the_first_look_and_restarts_on_a_change() -> None:
    first = sight_lease(None, "v1", 10.0, "b")
    assert first == LeaseSighting("v1", 10.0, "b", renewed=False)
    assert sight_lease(first, "v1", 99.0, "b") is first
    assert sight_lease(first, "v2", 99.0, "b") == LeaseSighting("v2", 99.0, "b", renewed=True)
    assert sight_lease(first, "v1", 5.0, "other boot") == LeaseSighting("v1", 5.0, "other boot")


@pytest.mark.parametrize(("collector_skew", "lapsed"), [
    (-3600.0, False), (0.0, False), (20.0, False), (MAX_CLOCK_SKEW, False),
    (MAX_CLOCK_SKEW + 30, True),
])
def test_a_first_look_allows_the_stated_skew(collector_skew: float, lapsed: bool) -> None:
    until = iso(20)  # renewed 10 s ago with a 30 s lease, on the owner's clock
    first = LeaseSighting(until, 500.0, "b")
    reason = lease_lapsed(until, 30, NOW + timedelta(seconds=collector_skew), first, 500.0)
    assert (reason is not None) is lapsed


@pytest.mark.parametrize("collector_skew", [-86400.0, 0.0, 86400.0])
def test_a_watched_lease_is_judged_on_the_collectors_clock_alone(collector_skew: float) -> None:
    until = iso(20)
    wall = NOW + timedelta(seconds=collector_skew)
    renewed = LeaseSighting(until, 500.0, "b", renewed=True)
    assert lease_lapsed(until, 30, wall, renewed, 500.0 + 30) is None
    assert "unrenewed for 31s" in (lease_lapsed(until, 30, wall, renewed, 531.0) or "")
    # A dead owner whose clock ran an hour ahead: its lease is lapsed a lease after the
    # collector last saw it change, not an hour later.
    ahead = iso(3600)
    assert lease_lapsed(ahead, 30, NOW, LeaseSighting(ahead, 500.0, "b"), 531.0) is not None


# ---- expiry, warm time, display ------------------------------------------------------------

def test_expiry_and_warm_time() -> None:
    assert expires_at(NOW, 600) == iso(600) and expires_at(NOW, 0) == "never"
    assert warm_until(1000.0, 600) == 1600.0
    assert not wall_passed("never", NOW, same_clock=True)
    assert wall_passed(iso(-1), NOW, same_clock=True)
    assert not wall_passed(iso(-1), NOW, same_clock=False)  # another machine's: the skew
    assert wall_passed(iso(-MAX_CLOCK_SKEW - 1), NOW, same_clock=False)
    assert seconds_left(iso(25), NOW) == 25 and seconds_left(None, NOW) is None
    assert seconds_left("garbage", NOW) is None
