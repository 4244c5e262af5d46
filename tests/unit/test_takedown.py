"""Who may take a live stack down without ``--force`` (``infra/stacks/takedown.py``): pure, no engine."""

from __future__ import annotations

from skyward_iac.infra.stacks.gc import DEAD, ELSEWHERE, RUNNING
from skyward_iac.infra.stacks.takedown import Holder, refusal, takedown_message

STACK = "local-ana-20261122-101502-7c1e2a"


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


def test_a_dead_owner_or_a_lapsed_lease_lets_it_go() -> None:
    assert refusal(STACK, holder(DEAD)) is None
    assert refusal(STACK, holder(ELSEWHERE, lease_until="2026-11-22T10:20:00+00:00",
                                 lease_lapsed="its lease lapsed: unrenewed for 40s")) is None


def test_the_takedown_says_who_and_why() -> None:
    assert takedown_message("bo@machine-b", True, " the job hangs ") == \
        "skyward-iac down --force by bo@machine-b: the job hangs"
    assert takedown_message("bo@machine-b", False, None) == \
        "skyward-iac down by bo@machine-b: no reason given"
