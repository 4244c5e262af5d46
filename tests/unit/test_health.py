"""The health-check policy: consecutive failures per node, and how one probe is judged."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

import skyward_iac as sky
from skyward_iac.api.errors import ConfigError
from skyward_iac.api.spec import validated
from skyward_iac.orchestration.health import FailureTally, probe_outcome


def test_only_consecutive_failures_count_and_a_streak_fires_once() -> None:
    tally = FailureTally(limit=3)
    assert [tally.record(1, False) for _ in range(2)] == [False, False]
    assert tally.record(1, True) is False  # a pass resets the streak
    assert [tally.record(1, False) for _ in range(3)] == [False, False, True]
    assert tally.record(1, False) is False  # counting starts again after firing
    assert tally.record(0, False) is False  # nodes are counted apart


def test_a_replaced_node_starts_from_zero() -> None:
    tally = FailureTally(limit=2)
    tally.record(4, False)
    tally.forget(4)
    assert tally.record(4, False) is False


def done(value: object = None, error: BaseException | None = None) -> Future[object]:
    future: Future[object] = Future()
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)
    return future


def test_probe_outcomes() -> None:
    assert probe_outcome(done(True), 1) == (True, "")
    assert probe_outcome(done("ok"), 1) == (True, "")
    assert probe_outcome(done(False), 1) == (False, "check returned False")
    assert probe_outcome(done(error=OSError("disk full")), 1) == (False, "OSError: disk full")
    passed, why = probe_outcome(Future(), 0.01)
    assert not passed and "no answer within 0.01s" in why


def test_health_checker_validation() -> None:
    checker = sky.HealthChecker(check=lambda: True, interval=5, failures=2)
    assert sky.Options(health_checker=checker).health_checker is checker
    with pytest.raises(ConfigError, match="check"):
        validated(sky.HealthChecker, check="not callable")
    with pytest.raises(ConfigError, match="interval"):
        validated(sky.HealthChecker, check=lambda: True, interval=0)
