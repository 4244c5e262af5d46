"""The pure lifecycle policies: who gc collects or prunes, heartbeat and watchdog timing, tags."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from skyward_iac.api.deadlines import beat_interval, watch_interval
from skyward_iac.infra.stacks.gc import (
    DEAD,
    RUNNING,
    Look,
    collect_reason,
    owner_state,
    prune_reason,
)
from skyward_iac.infra.stacks.tags import (
    ProcessId,
    StackRecord,
    decode_tags,
    encode_tags,
    process_started,
)
from skyward_iac.node.watchdog import beat_state
from skyward_iac.orchestration.compute import ending

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def record(expires: str, count: int = 2, host: str = "here", pid: str = "42",
           created: str = "2026-11-22T11:00:00+00:00") -> StackRecord:
    return StackRecord("s", {"created_at": created, "expires_at": expires, "host": host,
                             "pid": pid, "pid_started": "7", "owner": "me@here"}, count)


def alive(pid: int, started: str) -> bool:
    return pid == 42 and started == "7"


def dead(pid: int, started: str) -> bool:
    return False


@pytest.mark.parametrize(("rec", "liveness", "collect"), [
    (record("2026-11-22T11:30:00+00:00"), dead, True),             # expired, owner dead
    (record("2026-11-22T11:30:00+00:00"), alive, False),           # expired, owner alive
    (record("2026-11-22T12:30:00+00:00"), dead, False),            # not expired yet
    (record("never"), dead, False),                                # ttl=0: never by expiry
    (record("2026-11-22T11:30:00+00:00", count=0), dead, False),   # already destroyed
    (record("2026-11-22T11:30:00+00:00", host="elsewhere"), alive, True),  # other machine
    (StackRecord("x", {}, 3), dead, False),                        # not a skyward stack
])
def test_collect_reason(rec: StackRecord, liveness, collect: bool) -> None:
    reason = collect_reason(rec, Look(NOW, "here", liveness))
    assert (reason is not None) == collect
    if reason:
        assert "expired" in reason and "me@here" in reason


def test_a_reused_pid_is_not_the_owner() -> None:
    tags = {"host": "here", "pid": "42", "pid_started": "8"}
    look = Look(NOW, "here", alive)
    assert owner_state(StackRecord("s", tags, 1), look) == DEAD
    assert owner_state(StackRecord("s", {**tags, "pid_started": "7"}, 1), look) == RUNNING
    assert owner_state(StackRecord("s", {"host": "here"}, 1), look) == DEAD  # no pid recorded


def test_this_process_start_time_is_known() -> None:
    assert process_started(os.getpid()) and process_started(os.getpid()) == process_started(os.getpid())


def test_prune_only_old_empty_stacks() -> None:
    old = record("never", count=0, created="2026-09-01T00:00:00+00:00")
    assert prune_reason(old, NOW, timedelta(days=30))
    assert prune_reason(record("never", count=0), NOW, timedelta(days=30)) is None
    assert prune_reason(record("never", count=1, created="2026-01-01T00:00:00+00:00"), NOW,
                        timedelta(days=30)) is None


def test_tags_round_trip_and_keep_filterable_ones_separate() -> None:
    tags = {"owner": "me@here", "expires_at": "never", "provider": "local", "ttl": "600",
            "nodes": "2", "pid": "42"}
    stored = encode_tags(tags)
    assert set(stored) == {"owner", "provider", "run"}
    assert decode_tags(stored) == tags
    older = {"owner": "me@here", "expires_at": "never", "run": '{"ttl":"600"}'}  # before 11-24
    assert decode_tags(older) == {"owner": "me@here", "expires_at": "never", "ttl": "600"}
    assert decode_tags({"owner": "x"}) == {"owner": "x"}


def test_heartbeat_and_watchdog_timing() -> None:
    assert beat_interval(600) == 30 and beat_interval(6) == 2 and beat_interval(1) == 0.5
    assert watch_interval(600) == 15 and watch_interval(6) == 1.5


def test_every_beat_changes_the_heartbeat_state_whatever_time_it_carries(tmp_path: Path) -> None:
    beat = tmp_path / "heartbeat"
    assert beat_state(beat) is None
    beat.write_text("beat 1\n")
    states = {beat_state(beat)}
    for stamp in (time.time() - 120, time.time() - 120, time.time() + 120):
        time.sleep(0.02)  # coarse kernel timestamps: the next stamp lands on a later tick
        os.utime(beat, (stamp, stamp))  # the old client's stamp, even the same one twice
        states.add(beat_state(beat))
    time.sleep(0.02)
    beat.write_text("beat 2\n")
    states.add(beat_state(beat))
    assert len(states) == 5


def test_how_a_run_ended() -> None:
    assert ending(None) == "pool closed"
    assert ending(KeyboardInterrupt()) == "interrupted (Ctrl+C)"
    assert ending(ValueError("x")) == "closed after ValueError"


def test_a_warm_pool_is_left_to_its_keeper_until_its_warm_time_is_over() -> None:
    expired = "2026-11-22T11:00:00+00:00"
    tags = {"created_at": expired, "expires_at": expired, "host": "here", "pid": "1",
            "owner": "me@here"}
    later, earlier = "2026-11-22T13:00:00+00:00", "2026-11-22T11:30:00+00:00"
    keeper = ProcessId("here", "", 77, "9")
    keeping = Look(NOW, "here", lambda pid, started: pid == 77, holders=lambda name: [keeper])
    assert collect_reason(StackRecord("s", {**tags, "warm_until": later}, 3), keeping) is None
    assert collect_reason(StackRecord("s", {**tags, "warm_until": earlier}, 3), keeping) is None
    # Its keeper's death ends the wait: nothing of this machine keeps it any more (the
    # keeper killed right after it tagged the stack warm left it until warm_until).
    gone = Look(NOW, "here", lambda pid, started: False, holders=lambda name: [keeper])
    assert collect_reason(StackRecord("s", {**tags, "warm_until": later}, 3), gone) is not None
    assert collect_reason(StackRecord("s", {**tags, "warm_until": earlier}, 3), gone) is not None
    # Another machine's warm pool: left alone until its warm time (with the clocks' slack).
    elsewhere = {**tags, "host": "there"}
    assert collect_reason(StackRecord("s", {**elsewhere, "warm_until": later}, 3), gone) is None


def test_orphan_sandboxes_are_those_of_this_backend_without_a_stack(tmp_path: Path) -> None:
    from skyward_iac.infra.programs.local_node import BACKEND_FILE, orphan_sandboxes, sandbox_dirs

    def sandbox(stack: str, backend: str | None) -> Path:
        node = tmp_path / stack / "node-0"
        (node / "run").mkdir(parents=True)
        if backend is not None:
            (node / BACKEND_FILE).write_text(backend)
        return node

    live, orphan = sandbox("live", "file:///a"), sandbox("gone", "file:///a")
    other_backend, unknown = sandbox("elsewhere", "s3://b"), sandbox("old", None)
    found = sandbox_dirs(tmp_path)
    assert set(found) == {live, orphan, other_backend, unknown}
    assert orphan_sandboxes(found, ["live"], "file:///a") == [orphan]
