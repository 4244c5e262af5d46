"""Leases: gc from any machine collects a stack only once its owner stopped renewing it, judged
on the collector's own clock; on the owner's own machine, by whether a holder still runs."""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from skyward_iac.api.deadlines import MIN_LEASE, LeaseSighting
from skyward_iac.infra.stacks import leases
from skyward_iac.infra.stacks.gc import DEAD, ELSEWHERE, RUNNING, Look, collect_reason, owner_state
from skyward_iac.infra.stacks.leases import LeaseRenewer
from skyward_iac.infra.stacks.tags import ProcessId, StackRecord

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
PAST = "2026-11-24T11:30:00+00:00"
FUTURE = "2026-11-24T12:30:00+00:00"


def stack(lease: str | None, host: str = "elsewhere", expires: str = PAST,
          boot: str = "") -> StackRecord:
    tags = {"created_at": "2026-11-24T10:00:00+00:00", "expires_at": expires, "host": host,
            "pid": "42", "pid_started": "7", "owner": "ana@laptop-a", "ttl": "30"}
    if boot:
        tags["boot_id"] = boot
    if lease is not None:
        tags["lease_until"] = lease
    return StackRecord("s", tags, 3)


def alive(pid: int, started: str) -> bool:
    return pid == 42 and started == "7"


def dead(pid: int, started: str) -> bool:
    return False


@pytest.mark.parametrize(("rec", "liveness", "collected"), [
    # Another machine's pool, created long ago, lease renewed: left alone, however old.
    (stack(FUTURE), dead, False),
    # Its owner stopped renewing long ago: collected from any machine.
    (stack(PAST), alive, True),
    # This machine's own pool whose owner died: collected at once, its lease notwithstanding.
    (stack(FUTURE, host="here"), dead, True),
    (stack(FUTURE, host="here", boot="b1"), dead, True),
    (stack(FUTURE, host="here"), alive, False),
    # The same host name in another boot (a reboot, or a namesake machine): its pid means
    # nothing here, so the lease decides.
    (stack(FUTURE, host="here", boot="b0"), dead, False),
    # A stack from before leases keeps the old rule (other host = gone once expired).
    (stack(None), alive, True),
])
def test_gc_follows_the_lease(rec: StackRecord, liveness, collected: bool) -> None:
    reason = collect_reason(rec, Look(NOW, "here", liveness, boot="b1"))
    assert (reason is not None) is collected
    if reason and rec.tags.get("lease_until") == PAST:
        assert "lease lapsed" in reason and "ana@laptop-a" in reason


def test_a_collector_whose_clock_runs_ahead_leaves_a_live_lease_alone() -> None:
    """The finding: 20 s of skew with a 30 s lease destroyed a live pool. A first look now
    allows MAX_CLOCK_SKEW; once a renewal has been seen, no skew matters at all."""
    until = (NOW + timedelta(seconds=20)).isoformat()
    live = stack(until)
    for skew in (20, 120, 290):
        ahead = NOW + timedelta(seconds=skew)
        assert collect_reason(live, Look(ahead, "here", dead, boot="b1", mono=100.0)) is None
    renewed = {"s": LeaseSighting(until, 95.0, "b1", renewed=True)}
    a_day_ahead = Look(NOW + timedelta(days=1), "here", dead, boot="b1", mono=100.0,
                       sightings=renewed)
    assert collect_reason(live, a_day_ahead) is None
    # Unrenewed for longer than the lease as this machine counts: lapsed, whatever the clocks.
    later = Look(NOW - timedelta(days=1), "here", dead, boot="b1", mono=95.0 + MIN_LEASE + 1,
                 sightings=renewed)
    assert "unrenewed for 31s" in (collect_reason(live, later) or "")


def test_a_holder_recorded_on_this_machine_keeps_the_stack(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm pool's adopter or keeper is not the creator the tags name: its holder record
    keeps gc and ``ls`` from calling the owner dead."""
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path))
    me = ProcessId.current()
    here = Look(NOW, me.host, lambda pid, started: pid == me.pid, boot=me.boot,
                holders=lambda name: leases.holders(name, lambda p: p.pid == me.pid))
    rec = stack(FUTURE, host=me.host, boot=me.boot)  # its creator, pid 42, is dead
    assert owner_state(rec, here) == DEAD
    record = leases.hold("s")
    assert owner_state(rec, here) == RUNNING and collect_reason(rec, here) is None
    leases.release(record)
    assert owner_state(rec, here) == DEAD
    assert "process of this machine and is gone" in (collect_reason(rec, here) or "")
    # A dead holder's record is no holder, and is removed once seen.
    (tmp_path / leases.HOLDERS / "s.999999.json").write_text(json.dumps(
        {"host": me.host, "boot": me.boot, "pid": 999999, "started": "1"}))
    assert owner_state(rec, here) == DEAD
    assert not (tmp_path / leases.HOLDERS / "s.999999.json").exists()
    assert owner_state(stack(FUTURE), here) == ELSEWHERE


def test_sightings_are_remembered_across_looks(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path))
    first = leases.sight_leases({"s": "v1"}, 10.0, "b1")["s"]
    assert (first.seen_at, first.renewed) == (10.0, False)
    assert leases.sight_leases({"s": "v1"}, 50.0, "b1")["s"] == first  # unchanged: kept
    second = leases.sight_leases({"s": "v2"}, 60.0, "b1")["s"]
    assert (second.seen_at, second.renewed) == (60.0, True)
    # Another boot: the monotonic clock started again, so what was seen counts for nothing.
    assert leases.sight_leases({"s": "v2"}, 5.0, "b2")["s"] == LeaseSighting("v2", 5.0, "b2")


def test_the_renewer_renews_changes_the_value_and_survives_a_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path))
    monkeypatch.setattr(leases, "renew_interval", lambda ttl: 0.05)
    renewed: list[str] = []
    enough = threading.Event()

    def renew(until: str) -> None:
        renewed.append(until)
        if len(renewed) == 1:
            raise OSError("the backend blinked")
        if len(renewed) >= 4:
            enough.set()

    renewer = LeaseRenewer("s", 600, renew).start()
    held = tmp_path / leases.HOLDERS / f"s.{os.getpid()}.json"
    assert held.exists()  # held on this machine while it renews
    assert enough.wait(5)
    renewer.stop()
    assert not held.exists()
    count = len(renewed)
    assert all(datetime.fromisoformat(u) > datetime.now(UTC) for u in renewed)
    written = renewed[1:]  # after the failure, every renewal moves the lease: a visible change
    assert written == sorted(set(written))
    threading.Event().wait(0.2)
    assert len(renewed) == count  # stopped means stopped
