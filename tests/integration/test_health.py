"""``Options.health_checker`` on a real Local pool: a node failing its probe is replaced."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward_iac as sky
from tests.workload import repeatedly, wait_for

SICK = "sick"


def node_is_well() -> bool:
    """The probe: a node is unhealthy while a ``sick`` file sits in its work directory."""
    return not (Path.cwd() / SICK).exists()


@sky.function
def square(x: int) -> tuple[int, int]:
    return sky.instance_info().node, x * x


@pytest.fixture(scope="module")
def watched() -> Iterator[tuple[sky.Pool, list[sky.Event]]]:
    events: list[sky.Event] = []
    checker = sky.HealthChecker(check=node_is_well, interval=1.0, timeout=10.0, failures=2)
    options = sky.Options(health_checker=checker, default_compute_timeout=60, console=False)
    with sky.Compute(provider=sky.Local(), nodes=2, options=options,
                     on_event=events.append) as pool:
        yield pool, events


def test_an_unhealthy_node_is_replaced_while_tasks_keep_working(
        watched: tuple[sky.Pool, list[sky.Event]]) -> None:
    pool, events = watched
    time.sleep(3)  # a few healthy rounds: no replacement
    assert not [e for e in events if isinstance(e, sky.InstanceReplaced)]
    old_workdir = pool.nodes[1].address.workdir
    old_address = pool.nodes[1].address.public_address
    (Path(old_workdir) / SICK).touch()

    with repeatedly(lambda: pool.map(square, range(6))) as results:
        assert wait_for(lambda: any(isinstance(e, sky.InstanceReplaced) for e in events), 180)

    preempted = [e for e in events if isinstance(e, sky.InstancePreempted)]
    assert [(e.node, "health check" in e.reason) for e in preempted] == [(1, True)]
    replaced = [e for e in events if isinstance(e, sky.InstanceReplaced)]
    assert [(e.node, e.old_instance_id) for e in replaced] == [(1, old_address)]
    assert results and all(sorted(v for _, v in r) == [x * x for x in range(6)] for r in results)
    # The new node 1 is healthy (fresh sandbox) and serves tasks again.
    assert not (Path(pool.nodes[1].address.workdir) / SICK).exists()
    after = pool.map(square, range(8))
    assert [v for _, v in after] == [x * x for x in range(8)]
    assert {node for node, _ in after} == {0, 1}
    assert sum(1 for e in events if isinstance(e, sky.InstanceReplaced)) == 1
