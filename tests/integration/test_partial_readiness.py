"""Partial readiness on a real Local pool: ``Nodes(desired=4, min=2)`` starts the ``with`` body
once two nodes are ready; the two slow ones join while it runs."""

from __future__ import annotations

import time

import skyward_iac as sky

#: Nodes 2 and 3 bootstrap this many seconds longer (a plugin's bootstrap step).
SLOW = 25


@sky.function
def whoami() -> int:
    return sky.instance_info().node


def slow_nodes(cluster: object) -> tuple[str, ...]:
    return (f'case "$W" in */node-2/work|*/node-3/work) sleep {SLOW};; esac',)


def test_the_body_starts_at_min_and_late_nodes_join() -> None:
    events: list[sky.Event] = []
    plugin = sky.plugins.Plugin.create("slow-nodes").with_bootstrap(slow_nodes)
    options = sky.Options(console=False, default_compute_timeout=60,
                          autoscale_idle_timeout=600, reconcile_tick_interval=60)
    started = time.monotonic()
    with sky.Compute(provider=sky.Local(), nodes=sky.Nodes(desired=4, min=2), plugins=[plugin],
                     options=options, on_event=events.append) as pool:
        entered = time.monotonic()
        assert pool.current_nodes() == 2
        assert [e.nodes for e in events if isinstance(e, sky.ClusterReady)] == [2]
        assert (whoami() @ pool) == [0, 1]  # a broadcast reaches the ready nodes
        deadline = time.monotonic() + 180
        while pool.current_nodes() < 4:
            assert time.monotonic() < deadline, f"only {pool.current_nodes()} nodes joined"
            time.sleep(0.2)
        joined = time.monotonic()
        assert (whoami() @ pool) == [0, 1, 2, 3]
        assert sorted(set(pool.map(lambda x: sky.instance_info().node, range(16)))) == [0, 1, 2, 3]
    # The body began well before the slow nodes were done.
    assert joined - entered > SLOW / 2, (entered - started, joined - entered)


def slow_head(cluster: object) -> tuple[str, ...]:
    return (f'case "$W" in */node-0/work) sleep {SLOW};; esac',)


@sky.function
def count_from_a_task() -> int:
    """A collections call made while the head (etcd) may still be bootstrapping."""
    return sky.counter("early").increment()


def test_min_nodes_means_any_nodes_and_collections_wait_for_a_slow_head() -> None:
    """``Nodes(desired=3, min=1)`` enters when ANY node is ready, not the head first: here the
    head is the slowest. Collections calls made before it is ready wait for it."""
    plugin = sky.plugins.Plugin.create("slow-head").with_bootstrap(slow_head)
    options = sky.Options(console=False, default_compute_timeout=120)
    started = time.monotonic()
    with sky.Compute(provider=sky.Local(), nodes=sky.Nodes(desired=3, min=1), plugins=[plugin],
                     options=options) as pool:
        entered = time.monotonic()
        in_service = [node.index for node in pool.nodes]
        assert 0 not in in_service and in_service, in_service
        assert whoami() >> pool in (1, 2)  # work starts on the nodes that are ready
        assert count_from_a_task() >> pool == 1  # waits for the head's etcd, then works
        assert pool.counter("early").value == 1  # the client's tunnel waited for it too
        head_at = time.monotonic()
        assert 0 in [node.index for node in pool.nodes]
    # The body began well before the slow head was done.
    assert head_at - entered > SLOW / 2, (entered - started, head_at - entered)
