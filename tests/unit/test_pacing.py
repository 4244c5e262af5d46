"""``Worker(buffer="auto")``: the pace policy (pure) and what the dispatcher sends with it
(fake agents), and the agent client measuring a real agent's pace."""

from __future__ import annotations

import pytest

import skyward_iac as sky
from skyward_iac.api.errors import ConfigError
from skyward_iac.remote.pacing import MAX_AHEAD, Pace
from tests.unit.test_pool_faults import Harness


def paced(overhead: float, duration: float) -> Pace:
    pace = Pace()
    pace.record(elapsed=overhead + duration, duration=duration, sent_idle=True)
    return pace


def test_nothing_is_sent_ahead_before_a_node_has_been_measured() -> None:
    assert Pace().ahead(1) == 0
    queued_only = Pace()
    queued_only.record(elapsed=0.01, duration=1e-5, sent_idle=False)
    assert queued_only.ahead(1) == 0  # no overhead sample: a queued task's wait is not one


def test_tasks_longer_than_a_round_trip_get_nothing_ahead() -> None:
    assert paced(overhead=0.0005, duration=0.001).ahead(1) == 0
    assert paced(overhead=0.040, duration=2.0).ahead(8) == 0  # a cloud round trip, long tasks


def test_short_tasks_get_a_round_trips_worth_and_trivial_ones_the_cap() -> None:
    assert paced(overhead=0.0005, duration=0.0001).ahead(1) == 5
    assert paced(overhead=0.0005, duration=0.0001).ahead(2) == 10  # per slot
    assert paced(overhead=0.0005, duration=1e-6).ahead(1) == MAX_AHEAD
    assert paced(overhead=0.0005, duration=0.0).ahead(1) == MAX_AHEAD


def test_queueing_does_not_inflate_the_overhead_and_averages_move() -> None:
    pace = paced(overhead=0.0005, duration=0.0001)
    for _ in range(50):  # sent behind 60 others: long waits, not overhead
        pace.record(elapsed=0.05, duration=0.0001, sent_idle=False)
    assert pace.overhead == pytest.approx(0.0005)
    for _ in range(50):  # the tasks became long
        pace.record(elapsed=0.2, duration=0.1, sent_idle=False)
    assert pace.ahead(1) == 0


def test_buffer_accepts_auto_or_a_count() -> None:
    assert sky.Worker().buffer == "auto" and sky.Worker().fixed_buffer == 0
    assert sky.Worker(buffer=8).fixed_buffer == 8
    for bad in (-1, "fast"):
        with pytest.raises(ConfigError, match="buffer"):
            sky.Worker(buffer=bad)


def test_dispatcher_sends_ahead_what_each_node_pace_allows() -> None:
    pool = Harness(nodes=2, worker=sky.Worker(concurrency=1))
    fast, slow = pool.nodes[0].agent, pool.nodes[1].agent
    fast.pace = paced(overhead=0.0005, duration=0.00005)  # 10 ahead
    slow.pace = paced(overhead=0.0005, duration=1.0)  # nothing ahead
    pool.dispatcher.enqueue(pool.calls(40))
    assert (fast.in_flight, slow.in_flight) == (11, 1)
    assert pool.dispatcher.slots_per_node == 1  # autoscaling and joblib count real slots


def test_a_fixed_buffer_ignores_the_pace() -> None:
    pool = Harness(nodes=1, worker=sky.Worker(concurrency=1, buffer=3))
    pool.nodes[0].agent.pace = paced(overhead=0.0005, duration=0.00005)
    pool.dispatcher.enqueue(pool.calls(40))
    assert pool.nodes[0].agent.in_flight == 4
