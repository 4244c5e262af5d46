"""``Worker(buffer="auto")``: the pace policy (pure) and what the dispatcher sends with it
(fake agents), and the agent client measuring a real agent's pace."""

from __future__ import annotations

import pytest

import skyward_iac as sky
from skyward_iac.api.errors import ConfigError
from skyward_iac.orchestration.dispatch import call_for
from skyward_iac.remote.calls import pack_call
from skyward_iac.remote.pacing import MAX_AHEAD, UNKNOWN, Pace, ahead
from tests.unit.test_pool_faults import Harness, wait_for


def paced(overhead: float, duration: float, name: str = "abs") -> Pace:
    pace = Pace()
    pace.record(name, elapsed=overhead + duration, duration=duration, sent_idle=True)
    return pace


def test_nothing_is_sent_ahead_before_a_node_has_been_measured() -> None:
    assert ahead(1, None, 0.0001) == 0
    assert ahead(1, 0.0005, UNKNOWN) == 0  # a function never measured counts as long
    queued_only = Pace()
    queued_only.record("abs", elapsed=0.01, duration=1e-5, sent_idle=False)
    assert queued_only.overhead is None  # a queued task's wait is not an overhead sample


def test_tasks_longer_than_a_round_trip_get_nothing_ahead() -> None:
    assert ahead(1, 0.0005, 0.001) == 0
    assert ahead(8, 0.040, 2.0) == 0  # a cloud round trip, long tasks


def test_short_tasks_get_a_round_trips_worth_and_trivial_ones_the_cap() -> None:
    assert ahead(1, 0.0005, 0.0001) == 5
    assert ahead(2, 0.0005, 0.0001) == 10  # per slot
    assert ahead(1, 0.0005, 1e-6) == MAX_AHEAD
    assert ahead(1, 0.0005, 0.0) == MAX_AHEAD


def test_run_times_are_per_function_and_averaged() -> None:
    pace = paced(overhead=0.0005, duration=0.0001, name="quick")
    pace.record("slow", elapsed=1.0, duration=1.0, sent_idle=False)
    assert pace.run_time("quick") == pytest.approx(0.0001)
    assert pace.run_time("slow") == 1.0 and pace.run_time("never") == UNKNOWN
    assert pace.overhead == pytest.approx(0.0005)  # the queued sample did not count
    for _ in range(50):
        pace.record("quick", elapsed=0.3, duration=0.2, sent_idle=False)
    assert ahead(1, pace.overhead, pace.run_time("quick")) == 0  # it became long


def test_what_a_node_holds_sets_the_longest_run_time() -> None:
    pace = paced(overhead=0.0005, duration=0.0001, name="quick")
    pace.record("slow", elapsed=1.0, duration=1.0, sent_idle=False)
    assert pace.longest_held() == 0.0
    pace.sent("quick")
    assert pace.longest_held() == pytest.approx(0.0001)
    pace.sent("slow")
    pace.sent("slow")
    pace.finished("slow")
    assert pace.longest_held() == 1.0
    pace.finished("slow")
    assert pace.longest_held() == pytest.approx(0.0001)
    pace.sent("unmeasured")
    assert pace.longest_held() == UNKNOWN


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


def test_a_long_or_unmeasured_call_waits_for_a_free_slot_and_later_calls_wait_behind_it() -> None:
    pool = Harness(nodes=1, worker=sky.Worker(concurrency=1))
    agent = pool.nodes[0].agent
    agent.pace = paced(overhead=0.0005, duration=0.00005)  # "abs" is trivial here
    first = pool.calls(3)
    pool.dispatcher.enqueue(first)
    assert agent.in_flight == 3
    unmeasured = sky.function(round)(1.5)
    odd, _ = call_for(unmeasured, pack_call(unmeasured), 999, None, 300.0)
    pool.dispatcher.enqueue([odd, *pool.calls(2)])
    assert agent.in_flight == 3  # "round" is not measured: it waits, and so do the rest
    for call in first:
        agent.finish(call.task_id, 1)
    wait_for(lambda: odd in agent.received)
    assert agent.in_flight == 1  # alone on the node: nothing queued behind it


def test_a_fixed_buffer_ignores_the_pace() -> None:
    pool = Harness(nodes=1, worker=sky.Worker(concurrency=1, buffer=3))
    pool.nodes[0].agent.pace = paced(overhead=0.0005, duration=0.00005)
    pool.dispatcher.enqueue(pool.calls(40))
    assert pool.nodes[0].agent.in_flight == 4
