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
