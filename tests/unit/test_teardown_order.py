"""The order a pool stops in is declared by its parts (``teardown.Phase``), not implied by the
order they were built in: the heartbeat and the reconciler stop before the node connections
close, the lease and the destroy come last but the console."""

from __future__ import annotations

import threading

import pytest

import skyward_iac as sky
from skyward_iac.observability.bus import EventBus
from skyward_iac.orchestration.identity import PoolIdentity
from skyward_iac.orchestration.parts import PoolParts
from skyward_iac.orchestration.plan import plan_pool
from skyward_iac.orchestration.teardown import Phase, Teardown


def test_steps_run_by_phase_whatever_order_they_were_added_in() -> None:
    ran: list[str] = []
    teardown = Teardown(PoolIdentity("s"))
    for phase, name in [(Phase.CONSOLE, "console"), (Phase.STACK, "destroy"),
                        (Phase.NODES, "nodes"), (Phase.HEARTBEAT, "heartbeat"),
                        (Phase.WATCHERS, "budget"), (Phase.WATCHERS, "autoscaler"),
                        (Phase.PLUGINS, "plugins")]:
        teardown.add(phase, name, lambda name=name: ran.append(name))
    teardown.run()
    # Within a phase the newest first (the autoscaler was started after the budget guard).
    assert ran == ["plugins", "autoscaler", "budget", "heartbeat", "nodes", "destroy", "console"]


def test_taking_another_teardown_keeps_each_step_in_its_phase() -> None:
    first, second = Teardown(PoolIdentity("a")), Teardown(PoolIdentity("a"))
    first.add(Phase.CONSOLE, "console", lambda: None)
    first.add(Phase.STACK, "destroy", lambda: None)
    second.add(Phase.NODES, "nodes", lambda: None)
    second.add(Phase.UPDATES, "stack updates", lambda: None)
    second.take(first)
    assert [name for _, name in second.order()] == ["stack updates", "nodes", "destroy",
                                                     "console"]
    assert first.order() == []


class NoEngineStack:
    """Only what building parts touches of a stack: the lease's first renewal is 10 s away."""

    name = "local-unit-20260101-000000-abcdef"

    def renew_lease(self, until: str) -> None:
        raise AssertionError("not renewed within the test")


def test_a_pools_parts_declare_the_order_they_stop_in() -> None:
    plan = plan_pool([], None, sky.Options(max_cost_usd=5, console=False),
                     {"provider": sky.Local(usd_per_hour=0.5), "nodes": 2, "ttl": 30})
    before = set(threading.enumerate())
    parts = PoolParts(plan, NoEngineStack(), EventBus(), lambda *_: None,  # type: ignore[arg-type]
                      lambda error: None)
    assert parts.identity.stack == plan.stack_name
    # Every part names the pool through the one identity object, not a copy of its name.
    assert parts.dispatcher.identity is parts.identity
    assert parts.dispatcher.events.tally.pool is parts.identity
    assert parts.nodes.identity is parts.identity and parts.reconciler.identity is parts.identity
    assert parts.nodes.heartbeat is not None and parts.nodes.heartbeat.identity is parts.identity
    order = [name for _, name in parts.teardown.order()]
    assert order == ["budget", "stack updates", "queued calls", "heartbeat", "nodes", "lease"]
    assert order.index("heartbeat") < order.index("nodes")
    assert order.index("stack updates") < order.index("nodes")
    started = set(threading.enumerate()) - before  # dispatcher, heartbeat, budget, lease
    assert len(started) == 4, [thread.name for thread in started]
    parts.discard("the test is over")
    assert parts.membership.stopped and parts.dispatcher.closed
    with pytest.raises(sky.NodeConnectionError):
        parts.dispatcher.enqueue([])
    for thread in started:  # they end with it
        thread.join(timeout=15)
        assert not thread.is_alive(), thread.name
