"""Leases: gc from any machine collects a stack only once its owner stopped renewing it."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from skyward_iac.infra.gc import collect_reason
from skyward_iac.infra.leases import (
    MIN_LEASE,
    LeaseRenewer,
    lapsed,
    lease_end,
    lease_seconds,
    renew_interval,
)
from skyward_iac.infra.tags import StackRecord

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
PAST = "2026-11-24T11:30:00+00:00"
FUTURE = "2026-11-24T12:30:00+00:00"


def stack(lease: str | None, host: str = "elsewhere", expires: str = PAST) -> StackRecord:
    tags = {"created_at": "2026-11-24T10:00:00+00:00", "expires_at": expires, "host": host,
            "pid": "42", "pid_started": "7", "owner": "ana@laptop-a"}
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
    # Its owner stopped renewing: collected from any machine.
    (stack(PAST), alive, True),
    # This machine's own pool whose owner died: collected early, even with a live lease.
    (stack(FUTURE, host="here"), dead, True),
    (stack(FUTURE, host="here"), alive, False),
    # A stack from before leases keeps the old rule (other host = gone).
    (stack(None), alive, True),
])
def test_gc_follows_the_lease(rec: StackRecord, liveness, collected: bool) -> None:
    reason = collect_reason(rec, NOW, "here", liveness)
    assert (reason is not None) is collected
    if reason and rec.tags.get("lease_until") == PAST:
        assert "lease lapsed" in reason and "ana@laptop-a" in reason


def test_lease_timing() -> None:
    assert lease_seconds(600) == 600 and renew_interval(600) == 200
    assert lease_seconds(6) == MIN_LEASE and renew_interval(6) == MIN_LEASE / 3
    assert lease_end(600, NOW) == (NOW + timedelta(seconds=600)).isoformat(timespec="seconds")
    assert lapsed({"lease_until": PAST}, NOW) is True
    assert lapsed({"lease_until": FUTURE}, NOW) is False
    assert lapsed({}, NOW) is None


def test_the_renewer_renews_and_survives_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    import skyward_iac.infra.leases as leases

    monkeypatch.setattr(leases, "renew_interval", lambda ttl: 0.05)
    renewed: list[str] = []
    enough = threading.Event()

    def renew(until: str) -> None:
        renewed.append(until)
        if len(renewed) == 1:
            raise OSError("the backend blinked")
        if len(renewed) >= 3:
            enough.set()

    renewer = LeaseRenewer("s", 600, renew).start()
    assert enough.wait(5)
    renewer.stop()
    count = len(renewed)
    assert all(datetime.fromisoformat(u) > datetime.now(UTC) for u in renewed)
    threading.Event().wait(0.2)
    assert len(renewed) == count  # stopped means stopped
