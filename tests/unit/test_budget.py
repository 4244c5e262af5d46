"""``Options(max_cost_usd)``: the pure deadline functions, the option and price validation,
the policy rule, the reviewed plan's budget, the client's guard and the Local node's watchdog
(run for real on a sandbox of its own). The pools themselves: tests/integration/test_budget.py
and tests/chaos/test_budget_nodes.py."""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.api.deadlines import (
    budget_note,
    next_look,
    read_budget_note,
    seconds_until_spent,
    start_watch,
    watchdog_stop_reason,
)
from skyward_iac.infra.capacity import policy
from skyward_iac.infra.capacity.policy import PoolFacts
from skyward_iac.observability.bus import EventBus
from skyward_iac.observability.events import InstanceProvisioned
from skyward_iac.orchestration import reviewed
from skyward_iac.orchestration.budget import BudgetGuard, NoBudget, about
from skyward_iac.orchestration.cost import CostMeter
from skyward_iac.orchestration.identity import PoolIdentity
from skyward_iac.orchestration.lifecycle import ending
from skyward_iac.orchestration.plan import plan_pool

# ---- the pure functions ---------------------------------------------------------------------


def test_seconds_until_spent_at_a_rate() -> None:
    assert seconds_until_spent(5, 0, 3600) == pytest.approx(5)      # $1/s
    assert seconds_until_spent(5, 4, 7200) == pytest.approx(0.5)    # $2/s, $1 left
    assert seconds_until_spent(5, 5, 3600) == 0
    assert seconds_until_spent(5, 6, 3600) == 0                     # overspent: at once
    assert seconds_until_spent(5, 1, 0) is None                     # free nodes: never


def test_the_note_is_whole_seconds_rounded_up_or_none() -> None:
    assert budget_note(None) == "none\n"
    assert budget_note(12.01) == "13\n"  # the node must never stop before its client
    assert budget_note(-3) == "0\n"


@pytest.mark.parametrize(("note", "expected"), [
    ("42\n", 142.0), ("1.5", 101.5), ("none\n", None),
    ("", 7.0), ("4x", 7.0), ("-1", 7.0), ("inf", 7.0),  # half written or foreign: kept
])
def test_the_node_reads_a_duration_from_when_it_saw_the_note(note: str,
                                                             expected: float | None) -> None:
    assert read_budget_note(note, now=100.0, previous=7.0) == expected


def test_the_watchdog_stops_at_the_budgets_deadline_and_sleeps_no_later() -> None:
    watch = start_watch("beat", 0.0)
    reason = watchdog_stop_reason(watch, 50.0, started=0.0, ttl=600, budget_end=50.0)
    assert reason is not None and "max_cost_usd" in reason
    assert watchdog_stop_reason(watch, 49.9, started=0.0, ttl=600, budget_end=50.0) is None
    assert watchdog_stop_reason(watch, 1e6, started=0.0, ttl=0, budget_end=None) is None
    assert next_look(15.0, 40.0, None) == 15.0
    assert next_look(15.0, 40.0, 43.0) == pytest.approx(3.0)
    assert next_look(15.0, 40.0, 30.0) == 0.05  # past: look again at once


def test_durations_read_as_people_say_them() -> None:
    assert about(None) == "never at this rate"
    assert [about(s) for s in (40, 720, 12600)] == ["40 s", "12 min", "3.5 h"]


# ---- the option, the Local price, the plan --------------------------------------------------

@pytest.mark.parametrize("value", [0, -5, "5", True, float("inf"), float("nan")])
def test_a_bad_budget_is_refused(value: object) -> None:
    with pytest.raises(sky.ConfigError, match="max_cost_usd"):
        sky.Options(max_cost_usd=value)


@pytest.mark.parametrize("value", [-1, "3600", True, float("inf")])
def test_a_bad_local_price_is_refused(value: object) -> None:
    with pytest.raises(sky.ConfigError, match="usd_per_hour"):
        sky.Local(usd_per_hour=value)


def test_a_local_price_is_the_plans_rate_and_defaults_to_free() -> None:
    priced = plan_pool([], None, sky.Options(max_cost_usd=5),
                       {"provider": sky.Local(usd_per_hour=3600), "nodes": 2})
    assert priced.usd_per_hour(priced.request) == 7200  # each node at its price
    assert priced.choice.hourly == 3600
    free = plan_pool([], None, None, {"provider": sky.Local()})
    assert free.usd_per_hour(free.request) == 0


def test_a_budget_without_a_watchdog_is_refused_before_anything_exists() -> None:
    with pytest.raises(sky.ConfigError, match=r"max_cost_usd=5\) needs the nodes' dead-man"):
        plan_pool([], None, sky.Options(max_cost_usd=5), {"provider": sky.Local(), "ttl": 0})


def test_the_history_says_the_budget_ended_the_run() -> None:
    error = sky.BudgetExceededError("spent", budget_usd=5, spent_usd=5.0123, usd_per_hour=3600)
    assert ending(error) == "budget spent: $5.01 of Options(max_cost_usd=5)"


# ---- the policy rule -------------------------------------------------------------------------

POOL = PoolFacts(provider="local", region=None, instance_type=None, usd_per_hour=3600,
                 max_nodes=1, ttl=600, max_lifetime=None, tags={}, max_cost_usd=None)


@pytest.mark.parametrize(("asked", "needle"), [
    (None, "Options(max_cost_usd) is not set, the limit is $100"),
    (150.0, "Options(max_cost_usd) is $150, the limit is $100"),
    (100.0, None), (20.0, None),
])
def test_the_policy_rule_demands_a_budget_no_larger_than_its_own(asked: float | None,
                                                                 needle: str | None) -> None:
    rules = policy.parse({"max_cost_usd": 100}, "team.toml")
    problems = policy.violations(rules, dataclasses.replace(POOL, max_cost_usd=asked))
    if needle is None:
        assert problems == []
    else:
        assert len(problems) == 1 and needle in problems[0]
        assert problems[0].startswith("policy.max_cost_usd (team.toml)")


def test_the_strictest_budget_wins_and_a_bad_one_is_refused() -> None:
    merged = policy.strictest([policy.parse({"max_cost_usd": 500}, "team"),
                               policy.parse({"max_cost_usd": 50.5}, "project")])
    assert merged.max_cost_usd == 50.5 and merged.sources["max_cost_usd"] == "project"
    with pytest.raises(sky.ConfigError, match="policy.max_cost_usd must be a positive number"):
        policy.parse({"max_cost_usd": 0}, "team.toml")


def test_compute_is_refused_by_the_budget_and_price_rules(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A priced Local pool meets the cost rules as a cloud one would, before any stack."""
    monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "home"))
    team = tmp_path / "team.toml"
    team.write_text("[policy]\nmax_cost_usd = 10\nmax_usd_per_hour = 100\n")
    monkeypatch.setenv(policy.POLICY_ENV, str(team))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(policy.PolicyError) as refused:
        with sky.Compute(provider=sky.Local(usd_per_hour=3600)):
            pass
    message = str(refused.value)
    assert "policy.max_cost_usd" in message and "is not set, the limit is $10" in message
    assert "policy.max_usd_per_hour" in message and "$3600.0000/h" in message
    assert not (tmp_path / "home" / "state").exists() or \
        not any((tmp_path / "home" / "state").rglob("*.json"))


# ---- a reviewed plan's budget ---------------------------------------------------------------

def test_a_reviewed_budget_bounds_whoever_applies_the_plan() -> None:
    facts = reviewed.plan_facts(plan_pool([], None, sky.Options(max_cost_usd=50),
                                          {"provider": sky.Local()}))
    assert facts["max_cost_usd"] == 50
    assert reviewed.budget_difference(50, 50) == []
    assert reviewed.budget_difference(50, 20) == []  # tighter is fine
    assert reviewed.budget_difference(None, 80) == []  # the plan set none
    assert "max_cost_usd: 50 -> 80" in reviewed.budget_difference(50, 80)[0]
    assert "max_cost_usd: 50 -> None" in reviewed.budget_difference(50, None)[0]


# ---- the client's guard ----------------------------------------------------------------------

class Recorder:
    """The guard's events and what it handed the pool."""

    def __init__(self) -> None:
        self.bus = EventBus()
        self.events: list[Any] = []
        self.bus.subscribe(self.events.append)
        self.spent: list[sky.BudgetExceededError] = []
        self.done = threading.Event()

    def on_spent(self, error: sky.BudgetExceededError) -> None:
        self.spent.append(error)
        self.done.set()


def test_the_guard_warns_at_80_percent_then_hands_the_pool_its_error_once() -> None:
    seen = Recorder()
    meter = CostMeter(0.0)  # free until a resize gives it a rate
    guard = BudgetGuard(1.0, meter, PoolIdentity("s"), seen.bus, seen.on_spent)
    try:
        assert not seen.done.wait(0.3) and seen.events == []  # free: it never fires
        version, text = guard.note()
        assert text == "none\n"
        seen.bus.emit(InstanceProvisioned(stack="s", node=0))  # bills from its launch
        meter.set_rate(36000.0)  # $10 a second: $1 in 0.1 s; the change wakes the guard
        assert guard.note()[0] != version  # the nodes are told again
        assert seen.done.wait(10), "the guard never fired"
        time.sleep(0.2)
    finally:
        guard.stop()
    told = [e for e in seen.events if not isinstance(e, InstanceProvisioned)]
    assert [type(e).__name__ for e in told] == ["BudgetWarning", "BudgetExceeded"]
    warning, exceeded = told
    assert 0.8 <= warning.spent_usd < 1.0 and not warning.fatal
    assert exceeded.fatal and exceeded.spent_usd >= 1.0
    assert len(seen.spent) == 1
    error = seen.spent[0]
    assert error.budget_usd == 1.0 and error.usd_per_hour == 36000.0
    assert "max_cost_usd=1)" in str(error) and "closed and its stack destroyed" in str(error)


def test_a_change_of_rate_moves_the_deadline_the_nodes_are_told() -> None:
    seen = Recorder()
    now = [0.0]
    meter = CostMeter(3600.0, clock=lambda: now[0])  # $1/s
    guard = BudgetGuard(100.0, meter, PoolIdentity("s"), seen.bus, seen.on_spent)
    told: list[int] = []
    seen.bus.emit(InstanceProvisioned(stack="s", node=0))  # launched at 0
    guard.listen(lambda: told.append(guard.note()[0]))
    try:
        now[0] = 20.0
        assert guard.note()[1] == "80\n"
        meter.set_rate(7200.0)  # resized to two nodes: $2/s from here
        assert guard.note()[1] == "40\n" and len(told) == 1
        meter.add(10.0)  # a warm pool's past, counted on adoption
        assert guard.note()[1] == "35\n" and len(told) == 2
    finally:
        guard.stop()
    assert NoBudget().note() == (0, "none\n")


# ---- the Local node's watchdog, run for real -------------------------------------------------

def test_the_local_watchdog_stops_the_node_when_the_budget_it_was_told_runs_out(
        tmp_path: Path) -> None:
    sandbox = tmp_path / "node-0"
    (sandbox / "work").mkdir(parents=True)
    heartbeat, budget = sandbox / "work" / "heartbeat", sandbox / "work" / "budget"
    heartbeat.touch()
    log = tmp_path / "watchdog.log"
    with log.open("wb") as out:
        watchdog = subprocess.Popen(
            [sys.executable, "-m", "skyward_iac.node", "watchdog", "--heartbeat", str(heartbeat),
             "--ttl", "2", "--first-contact", "600", "--sandbox", str(sandbox)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        budget.write_text("none\n")
        time.sleep(1.0)
        assert watchdog.poll() is None
        told = time.monotonic()
        budget.write_text("2\n")  # two seconds left, counted from when it sees this
        end = time.monotonic() + 30
        while watchdog.poll() is None and time.monotonic() < end:
            with contextlib.suppress(OSError):  # gone with the sandbox once it stops
                heartbeat.write_text(f"beat {time.monotonic()}\n")  # the client is alive
            time.sleep(0.1)
        stopped = time.monotonic() - told
    finally:
        if watchdog.poll() is None:
            watchdog.kill()
        watchdog.wait()
    text = log.read_text()
    assert "max_cost_usd" in text and "shutting the node down" in text, text
    assert not sandbox.exists()  # the node's sandbox is gone with its processes
    # Seen within a look (0.5 s at ttl 2), then stopped at the deadline, not a look later.
    assert 2.0 <= stopped <= 2.0 + 0.5 + 5, stopped
