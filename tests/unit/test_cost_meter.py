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
