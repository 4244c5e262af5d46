"""Who may destroy a live stack (``infra/stacks/takedown.py``): the one policy every destroyer
goes through (``infra/stacks/destroy.py``); pure, no engine."""

from __future__ import annotations

from datetime import UTC, datetime

from skyward_iac.infra.stacks.gc import DEAD, ELSEWHERE, RUNNING, Look, collect_reason
from skyward_iac.infra.stacks.tags import StackRecord, ended_of, ended_value
from skyward_iac.infra.stacks.takedown import (
    Holder,
    destroy_message,
    down_reason,
    holder_of,
    refusal,
)

STACK = "local-ana-20261122-101502-7c1e2a"
NOW = datetime(2026, 11, 22, 10, 20, tzinfo=UTC)


def holder(state: str, **fields: object) -> Holder:
    return Holder(**{"owner": "ana@machine-a", "host": "machine-a", "pid": "4242",
                     "state": state, **fields})  # type: ignore[arg-type]


def test_a_live_lease_from_another_machine_refuses_naming_owner_host_lease_and_force() -> None:
    why = refusal(STACK, holder(ELSEWHERE, lease_until="2026-11-22T10:20:00+00:00",
                                lease_lapsed=None, lease_left=25.4))
    assert why is not None
    for part in ("ana@machine-a", "pid 4242 on machine-a", "until 2026-11-22T10:20:00+00:00",
                 "about 25s left", f"skyward-iac down {STACK} --force --reason"):
        assert part in why, part


def test_a_lease_past_its_end_on_this_clock_but_within_the_skew_still_holds() -> None:
    why = refusal(STACK, holder(ELSEWHERE, lease_until="2026-11-22T10:20:00+00:00",
                                lease_lapsed=None, lease_left=-12.0))
    assert why is not None and "ended 12s ago by this machine's clock, within the" in why


def test_the_owner_running_here_or_unjudgeable_elsewhere_refuses() -> None:
    assert "still runs on this machine" in str(refusal(STACK, holder(RUNNING)))
    assert "ttl=0" in str(refusal(STACK, holder(ELSEWHERE)))  # no lease to judge by


def test_a_dead_owner_a_lapsed_lease_or_an_expired_stack_lets_it_go() -> None:
    assert refusal(STACK, holder(DEAD)) is None
    assert refusal(STACK, holder(ELSEWHERE, lease_until="2026-11-22T10:20:00+00:00",
                                 lease_lapsed="its lease lapsed: unrenewed for 40s")) is None
    assert refusal(STACK, holder(ELSEWHERE, expired=True)) is None  # from before leases


def test_a_warm_pool_is_its_keepers_until_its_time_is_over() -> None:
    kept = holder(ELSEWHERE, warm_until="2026-11-22T10:30:00+00:00",
                  lease_until="2026-11-22T09:00:00+00:00", lease_lapsed="lapsed long ago")
    assert "kept for its next user until 2026-11-22T10:30:00" in str(refusal(STACK, kept))


def test_the_holder_and_force_may_always() -> None:
    for state in (RUNNING, ELSEWHERE):
        assert refusal(STACK, holder(state), holds=True) is None  # its pool's exit, its keeper
        assert refusal(STACK, holder(state), force=True) is None


def test_gc_never_collects_what_the_policy_refuses() -> None:
    """Every stack gc would collect, the one policy lets it destroy: gc's rule is stricter."""
    def alive(pid: int, started: str) -> bool:
        return pid == 42

    look = Look(NOW, "here", alive)
    base = {"created_at": "2026-11-22T09:00:00+00:00", "owner": "ana@x", "pid_started": "7"}
    cases = [
        {"host": "here", "pid": "42", "expires_at": "2026-11-22T09:30:00+00:00"},  # running
        {"host": "here", "pid": "43", "expires_at": "2026-11-22T09:30:00+00:00"},  # dead
        {"host": "here", "pid": "43", "expires_at": "never"},                      # dead, ttl=0
        {"host": "there", "pid": "42", "expires_at": "2026-11-22T09:30:00+00:00"},  # expired
        {"host": "there", "pid": "42", "expires_at": "never"},                      # ttl=0
        {"host": "there", "pid": "42", "expires_at": "never",
         "warm_until": "2026-11-22T11:00:00+00:00"},                                 # warm
    ]
    collected = 0
    for tags in cases:
        record = StackRecord(STACK, {**base, **tags}, 3)
        if collect_reason(record, look) is not None:
            collected += 1
            assert refusal(STACK, holder_of(record, look)) is None, tags
    assert collected == 2  # the dead owner's and the expired one


def test_the_destroy_says_who_and_why() -> None:
    assert destroy_message("bo@machine-b", down_reason(True, " the job hangs ")) == \
        "skyward: destroyed by bo@machine-b: skyward-iac down --force: the job hangs"
    assert down_reason(False, None) == "skyward-iac down: no reason given"


def test_the_ended_tag_fits_a_tag_value_and_reads_back() -> None:
    fields = ended_of({"ended": ended_value("destroy failed", "bo@machine-b", "self-declared",
                                            "down", "x" * 1000, "ProvisionError")})
    assert fields["status"] == "destroy failed" and fields["error"] == "ProvisionError"
    assert fields["by"] == "bo@machine-b" and fields["reason"].endswith("...")
    assert len(ended_value("destroyed", "a" * 50, "aws-sts", "gc", "é" * 400).encode()) <= 256
    assert ended_of({}) == {} and ended_of({"ended": "not json"}) == {}
