"""``CostMeter``: a pool's cost from launch, at the rate of each stretch it ran at."""

from __future__ import annotations

import pytest

from skyward_iac.orchestration.cost import CostMeter


def test_cost_counts_from_launch_at_each_rate() -> None:
    now = [1000.0]
    meter = CostMeter(2.0, clock=lambda: now[0])  # launched: 1 node at $2/h
    now[0] += 1800  # half an hour booting and running
    assert meter.total() == pytest.approx(1.0)
    assert meter.set_rate(6.0) is True  # resized to 3 nodes
    now[0] += 3600
    assert meter.set_rate(6.0) is False  # an update that changed nothing
    now[0] += 1800
    assert meter.set_rate(2.0) is True  # back to 1 node
    now[0] += 3600
    # 0.5 h x $2 + 1.5 h x $6 + 1 h x $2, not the final rate x the whole 3.5 h ($7).
    assert meter.total() == pytest.approx(1.0 + 9.0 + 2.0)


def test_a_warm_pool_taken_over_counts_its_life_before_the_meter() -> None:
    from skyward_iac.orchestration.warm import WarmPool
    from skyward_iac.outputs import ClusterOutputs

    # Up at t=1000 and $0.50 spent when it went warm at t=2800; idle at $1/h until adopted.
    warm = WarmPool("s", ClusterOutputs(nodes=(), ssh_private_key="k", agent_token="t"),
                    {}, 1, up_since=1000.0, warm_since=2800.0, spent_usd=0.5)
    assert warm.age(4600.0) == 3600.0
    assert warm.cost_at(4600.0, usd_per_hour=1.0) == pytest.approx(0.5 + 0.5)
    now = [0.0]
    meter = CostMeter(1.0, clock=lambda: now[0])
    meter.add(warm.cost_at(4600.0, 1.0))
    now[0] += 1800
    assert meter.total() == pytest.approx(1.5)
    assert WarmPool.from_json(warm.to_json()).cost_at(4600.0, 1.0) == pytest.approx(1.0)
    # A keeper of an older version says nothing of the past: nothing is made up.
    old = WarmPool.from_json({k: v for k, v in warm.to_json().items()
                              if k not in ("up_since", "warm_since", "spent_usd")})
    assert old.age(9e9) == 0.0 and old.cost_at(9e9, 1.0) == 0.0


def launches_meter(rate: float, nodes: int) -> tuple[CostMeter, list[float]]:
    now = [0.0]
    meter = CostMeter(rate, clock=lambda: now[0], nodes=nodes)
    meter.track_launches()
    return meter, now


def test_with_launches_tracked_each_node_bills_from_its_own_launch_until_gone() -> None:
    meter, now = launches_meter(7200.0, 2)  # $1/s per node
    meter.up_started()
    now[0] = 10.0
    assert meter.reading() == (0.0, 0.0)  # a cold start bills nothing before a launch
    meter.launched(0)
    now[0] = 15.0
    meter.launched(1)
    meter.launched(1)  # reported twice: counted once
    now[0] = 20.0
    meter.up_ended()
    meter.set_rate(7200.0, 2)  # applied: both launches were reported, nothing retroactive
    now[0] = 30.0
    assert meter.reading() == pytest.approx((20.0 + 15.0, 7200.0))
    meter.gone(1)
    now[0] = 40.0
    assert meter.reading() == pytest.approx((30.0 + 15.0, 3600.0))


def test_a_node_whose_launch_was_not_reported_counts_from_the_start_of_the_up() -> None:
    meter, now = launches_meter(3600.0, 1)  # $1/s
    now[0] = 5.0
    meter.up_started()
    now[0] = 6.0
    meter.up_started()  # a later step of the same update does not move its start
    now[0] = 12.0
    meter.set_rate(3600.0, 1)  # applied, and no launch reported: from 5.0, conservatively
    assert meter.total() == pytest.approx(7.0)
    now[0] = 20.0
    assert meter.total() == pytest.approx(15.0)
    meter.up_started()  # a resize to 2 nodes: the new one's launch is not reported
    now[0] = 24.0
    meter.set_rate(7200.0, 2)
    assert meter.reading() == pytest.approx((19.0 + 4.0, 7200.0))


def test_a_warm_pool_adopted_bills_its_nodes_from_the_meter_start() -> None:
    meter, now = launches_meter(7200.0, 2)
    now[0] = 3.0
    meter.align(100.0)  # no update: its nodes ran all along
    assert meter.reading() == pytest.approx((6.0, 7200.0))
