"""The one retry policy (``skyward_iac/api/retry.py``): its numbers (pure), and two loops that
follow it (a node start given up, a destroy waiting for a locked stack)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import skyward_iac as sky
from skyward_iac.api import retry
from skyward_iac.api.retry import Attempts, RetryPolicy


def test_one_formula_doubles_from_the_delay_and_stops_at_the_cap() -> None:
    policy = RetryPolicy("x", delay=2.0, cap=60.0)
    assert [policy.delay_before(n) for n in range(1, 9)] == [0, 2, 4, 8, 16, 32, 60, 60]
    fixed = RetryPolicy("x", delay=1.5, factor=1.0)
    assert {fixed.delay_before(n) for n in range(2, 20)} == {1.5}
    assert RetryPolicy("x").delay_before(5) == 0.0  # no delay asked: none


def test_jitter_spreads_each_delay_within_its_fraction_and_never_past_the_cap() -> None:
    policy = RetryPolicy("x", delay=1.0, jitter=0.25, cap=3.0)
    assert policy.delay_before(2, draw=lambda: 0.0) == pytest.approx(0.75)
    assert policy.delay_before(2, draw=lambda: 0.5) == pytest.approx(1.0)
    assert policy.delay_before(3, draw=lambda: 0.999999) == pytest.approx(2.5, abs=1e-5)
    assert policy.delay_before(4, draw=lambda: 0.999999) == 3.0  # 4 * 1.25 capped at 3
    spread = {round(policy.delay_before(2), 6) for _ in range(200)}
    assert len(spread) > 1 and all(0.75 <= d <= 1.25 for d in spread)


def test_attempts_and_time_bound_which_attempt_may_be_made() -> None:
    counted = RetryPolicy("x", attempts=3)
    assert [counted.allows(n) for n in (1, 2, 3, 4)] == [True, True, True, False]
    timed = RetryPolicy("x", within=10.0, delay=1.0, factor=1.0)
    assert timed.allows(50, elapsed=9.9) and not timed.allows(2, elapsed=10.0)
    assert timed.allows(1, elapsed=99.0)  # the first attempt is always made


def test_again_gives_the_delay_or_none_for_a_failure_not_worth_retrying() -> None:
    policy = RetryPolicy("x", attempts=3, delay=1.0,
                         retryable=lambda e: isinstance(e, OSError))
    assert policy.again(OSError("refused"), failed=1) == 1.0
    assert policy.again(OSError("refused"), failed=2) == 2.0
    assert policy.again(OSError("refused"), failed=3) is None  # the third was the last
    assert policy.again(ValueError("bad key"), failed=1) is None
    assert RetryPolicy("x").again(KeyboardInterrupt(), failed=1) is None
    timed = RetryPolicy("x", within=5.0, delay=1.0, factor=1.0)
    assert timed.again(OSError(), failed=9, elapsed=3.9) == 1.0
    assert timed.again(OSError(), failed=9, elapsed=4.0) is None  # 4 + 1 is not within 5


def test_one_sequence_shared_by_two_loops_is_bounded_once() -> None:
    attempts = Attempts(3)
    assert attempts.made == 1 and not attempts.exhausted()
    assert attempts.spend() == 2  # e.g. the node fallback moves a node to a sibling zone
    assert attempts.spend() == 3  # then failover moves the pool to another region
    assert attempts.exhausted() and not attempts.cut_short
    assert attempts.spend() is None and attempts.cut_short
    unbounded = Attempts(None)
    assert [unbounded.spend() for _ in range(4)] == [2, 3, 4, 5] and not unbounded.exhausted()


def test_the_policies_come_from_the_options_that_bound_them() -> None:
    default = sky.Options()
    start = retry.for_node_start(default)
    assert start.attempts == 3 and [start.delay_before(n) for n in (2, 3, 4)] == [2, 4, 8]
    assert retry.for_converge(default).attempts is None
    assert retry.for_converge(default).delay_before(9) == retry.MAX_DELAY
    place = retry.for_provision(default)
    assert place.attempts == 3 and place.delay_before(3) == 0.0
    tuned = sky.Options(max_provision_attempts=5, provision_retry_delay=0.5,
                        retry_on_interruption=1)
    assert retry.for_node_start(tuned).attempts == 5
    assert retry.for_node_start(tuned).delay_before(3) == 1.0
    assert retry.for_provision(tuned).attempts == 5
    assert {retry.for_provision(tuned).delay_before(n) for n in (2, 3, 4)} == {0.5}
    assert retry.for_task(tuned).attempts == 2  # the first run and one retry
    ssh = retry.for_ssh_connect(interval=1.0, wait=30.0)
    assert ssh.attempts is None and ssh.delay_before(7) == 1.0
    assert ssh.allows(30, elapsed=29.0) and not ssh.allows(31, elapsed=30.0)
    lock = retry.for_stack_lock(0.0)
    assert lock.again(RuntimeError("locked"), failed=1) is None  # no patience: no retry
    assert retry.ENGINE_COMMAND.attempts == 3


def test_a_node_start_is_recreated_after_the_delay_and_given_up_at_the_limit() -> None:
    import time

    from skyward_iac.orchestration.membership import Membership, Phase
    from skyward_iac.orchestration.plan import Bounds

    membership = Membership(Bounds(1, 1, 1), lambda nodes: None, lambda: None)
    membership.declared_now(1, (0,))
    policy = retry.for_node_start(sky.Options(max_provision_attempts=2,
                                              provision_retry_delay=5.0))
    before = time.monotonic()
    assert not membership.start_failed(0, "sshd down", policy)
    member = membership.member(0)
    assert member is not None and member.phase is Phase.LOST
    assert before + 5.0 <= member.retry_at <= time.monotonic() + 5.0
    membership.declared_now(1, (0,))  # the reconciler recreates it
    assert membership.start_failed(0, "sshd down again", policy)  # two in a row: given up
    assert membership.member(0).phase is Phase.FAILED  # type: ignore[union-attr]


def test_a_destroy_waits_for_a_locked_stack_within_its_patience_only() -> None:
    """``infra/stacks/destroy.py`` tries a locked stack again every ``LOCK_POLL`` seconds
    while its destroyer's patience lasts (``for_stack_lock``); none: at once ``busy``."""
    from skyward_iac.api.errors import StackBusyError
    from skyward_iac.infra.stacks import destroy
    from skyward_iac.infra.stacks.stack import ClusterStack

    class LockedStack(ClusterStack):
        """Locked by another update for its first ``busy`` destroys."""

        def __init__(self, busy: int) -> None:  # no engine: only what destroy() calls
            self.busy, self.tries, self.tags_added = busy, 0, {}  # type: ignore[var-annotated]

        @property
        def name(self) -> str:  # type: ignore[override]
            return "locked"

        def destroy(self, **_: object) -> None:  # type: ignore[override]
            self.tries += 1
            if self.tries <= self.busy:
                raise StackBusyError("the stack is locked by another update")

        def stale_locks(self) -> list[str]:  # type: ignore[override]
            return []

        def resource_count(self) -> int:
            return 3

        def tags(self) -> dict[str, str]:
            return {}

        def add_tag(self, key: str, value: str) -> None:
            self.tags_added[key] = value

    who = destroy.Destroyer(destroy.POOL, "test", actor="me@here", source="self-declared",
                            holds=True, patience=30.0)
    waited = LockedStack(busy=2)
    assert destroy.destroy(waited, who).status == destroy.DESTROYED
    assert waited.tries == 3
    impatient = LockedStack(busy=2)
    outcome = destroy.destroy(impatient, replace(who, patience=0.0))
    assert outcome.status == destroy.BUSY and impatient.tries == 1
