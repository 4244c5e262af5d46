"""``Options(max_lifetime=...)``: a hard cap on each node's life, beside the ttl."""

from __future__ import annotations

import pytest

import skyward_iac as sky
from skyward_iac.api.deadlines import BeatWatch, watchdog_stop_reason
from skyward_iac.api.errors import ConfigError
from skyward_iac.infra.programs import common
from skyward_iac.orchestration.plan import plan_pool


def test_the_option_reaches_the_stack_request() -> None:
    plan = plan_pool([], None, sky.Options(max_lifetime=3600),
                     {"provider": sky.GCP(), "accelerator": sky.accelerators.L4()})
    assert plan.request.max_lifetime == 3600
    assert common.plan_cluster(plan.request).max_lifetime == 3600
    assert plan_pool([], None, sky.Options(), {"provider": sky.Local()}).request.max_lifetime \
        is None


@pytest.mark.parametrize("value", [0, 59, -1, 10**9, "1h"])
def test_bad_lifetimes_are_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="max_lifetime"):
        sky.Options(max_lifetime=value)


@pytest.mark.parametrize(("silence", "ttl", "age", "cap", "stops"), [
    (5, 10, 100, None, None),                 # beating, no cap: lives
    (11, 10, 100, None, "no heartbeat"),      # silent past its ttl
    (5, 10, 3601, 3600, "max_lifetime"),      # beating, but past its cap
    (5, 0, 3599, 3600, None),                 # no ttl, under its cap
    (10**6, 0, 10, None, None),               # ttl 0: the heartbeat does not matter
])
def test_the_watchdog_stops_for_silence_or_age(silence: float, ttl: float, age: float,
                                               cap: float | None, stops: str | None) -> None:
    now = 10_000.0
    watch = BeatWatch("beaten", now - silence, beaten=True)
    reason = watchdog_stop_reason(watch, now, started=now - age, ttl=ttl, max_lifetime=cap)
    assert (reason is None) if stops is None else (stops in (reason or ""))
