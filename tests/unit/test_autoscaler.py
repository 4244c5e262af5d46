"""The autoscaling policy, with no pool at all."""

from __future__ import annotations

from skyward_iac.orchestration.autoscaler import PoolLoad, desired_nodes


def decide(nodes: int, queued: int, running: int, *, now: float = 100.0, last_change: float = 0.0,
           idle_since: float | None = None, slots: int = 1, floor: int = 1, ceiling: int = 4) -> int:
    load = PoolLoad(nodes, queued, running, slots, floor, ceiling)
    return desired_nodes(load, now=now, last_change=last_change, idle_since=idle_since,
                         cooldown=10, idle_timeout=30)


def test_pressure_grows_the_pool_up_to_the_ceiling() -> None:
    assert decide(1, queued=1, running=1) == 2
    assert decide(1, queued=20, running=1) == 4
    assert decide(2, queued=3, running=4, slots=2) == 4  # 7 calls need 4 nodes of 2 slots


def test_no_change_within_the_cooldown() -> None:
    assert decide(1, queued=20, running=1, now=105, last_change=100) == 1


def test_idle_shrinks_to_the_floor_only_after_the_idle_timeout() -> None:
    assert decide(4, 0, 0, now=100, idle_since=80) == 4   # idle 20 s < 30 s
    assert decide(4, 0, 0, now=100, idle_since=60) == 1   # idle 40 s
    assert decide(4, 0, 0, now=100, idle_since=60, floor=2) == 2


def test_busy_pool_keeps_its_size() -> None:
    assert decide(3, 0, 3) == 3
    assert decide(3, 0, 1, idle_since=None) == 3
