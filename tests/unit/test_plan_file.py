"""The plan file's seal and layout (``orchestration/plan_file.py``) and gc's rule for the stacks
of plans nobody applied (``infra/stacks/planned.py``): pure functions, no engine."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest

from skyward_iac.api.deadlines import MAX_CLOCK_SKEW
from skyward_iac.infra.stacks.planned import (
    PLAN_APPLIED,
    PLAN_EXPIRES,
    PLANNED_TO,
    expired_plan_reason,
    plan_expires,
)
from skyward_iac.infra.stacks.tags import StackRecord
from skyward_iac.orchestration import plan_file

STACK = "local-ana-20261122-101502-7c1e2a"


@dataclass(frozen=True)
class Res:
    op: str
    type: str
    name: str


def document() -> dict[str, object]:
    body = {"skyward_plan": plan_file.PLAN_FORMAT, "digest": "", "stack": STACK,
            "usd_per_hour": 1.25, "facts": {"nodes": 2, "tags": {"team": "ml"}},
            "resources": {"node-0": {"op": "create", "type": "t"}},
            "engine_plan": {"resourcePlans": {"urn:a": {"steps": ["create"]}}}}
    body["digest"] = plan_file.digest(body)
    return body


@pytest.mark.parametrize("edit", [
    lambda d: d["facts"]["tags"].update(team="ops"),
    lambda d: d.update(usd_per_hour=0.5),
    lambda d: d["facts"].update(nodes=3),
    lambda d: d["resources"].pop("node-0"),
    lambda d: d["engine_plan"]["resourcePlans"]["urn:a"]["steps"].append("delete"),
    lambda d: d.update(stack="local-ana-other"),
])
def test_any_edit_changes_the_digest(edit: object) -> None:
    sealed = document()
    edited = json.loads(json.dumps(sealed))
    edit(edited)  # type: ignore[operator]
    assert plan_file.digest(edited) != sealed["digest"]


def test_the_digest_ignores_layout_and_key_order_but_not_values() -> None:
    sealed = document()
    reordered = json.loads(json.dumps(dict(reversed(list(sealed.items()))), indent=4))
    assert plan_file.digest(reordered) == sealed["digest"]
    assert plan_file.digest({**sealed, "digest": "anything"}) == sealed["digest"]
    assert str(sealed["digest"]).startswith("sha256:") and len(str(sealed["digest"])) == 71


def test_an_approved_digest_is_compared_whole() -> None:
    actual = str(document()["digest"])
    assert plan_file.same_digest(actual, actual)
    assert plan_file.same_digest(actual.removeprefix("sha256:").upper(), actual)
    assert not plan_file.same_digest(actual[:30], actual)  # a prefix is not an approval
    assert not plan_file.same_digest("", actual)


def test_the_stored_engine_plan_names_no_stack_and_comes_back_exactly() -> None:
    engine = {"resourcePlans": {f"urn:pulumi:{STACK}::skyward::t::node-0": {
        "goal": {"parent": f"urn:pulumi:{STACK}::skyward::pulumi:pulumi:Stack::skyward-{STACK}",
                 "inputs": {"stack": STACK}}}}}
    stored, stackless = plan_file.stackless(engine, STACK)
    assert stackless and STACK not in json.dumps(stored)
    assert plan_file.with_stack(stored, STACK, stackless) == engine
    odd = {"env": "${stack}", "stack": STACK}  # the placeholder's text already there
    kept, stackless = plan_file.stackless(odd, STACK)
    assert not stackless and plan_file.with_stack(kept, STACK, stackless) == odd


def test_resources_are_listed_by_logical_name() -> None:
    table = plan_file.resources_by_name([Res("create", "b:Node", "node-1"),
                                         Res("create", "b:Node", "node-0"),
                                         Res("create", "a:Key", "key"), Res("create", "b:Key", "key")])
    assert list(table) == ["key [a:Key]", "key [b:Key]", "node-0", "node-1"]
    assert table["node-0"] == {"op": "create", "type": "b:Node"}


def test_the_first_update_names_the_applier() -> None:
    mine, theirs = plan_file.applier_mark("a@x pid 1", "n1"), plan_file.applier_mark("b@y", "n2")
    newest_first = [("destroy", "skyward: pool closed"), ("update", f"applied by {theirs}"),
                    ("update", f"applied by {mine}"), ("refresh", "")]
    assert mine in str(plan_file.first_applier(newest_first))
    assert plan_file.first_applier([("refresh", "x")]) is None


NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def planned_record(**tags: str) -> StackRecord:
    base = {"created_at": (NOW - timedelta(hours=30)).isoformat(), "owner": "ana@box",
            "host": "box", PLANNED_TO: "/work/l4.plan.json",
            PLAN_EXPIRES: plan_expires(NOW - timedelta(hours=30), 24 * 3600)}
    return StackRecord(STACK, {**base, **tags}, 0)


def test_gc_removes_the_stack_of_an_expired_unapplied_plan_only() -> None:
    reason = expired_plan_reason(planned_record(), NOW, "box")
    assert reason is not None and "nobody applied" in reason and "ana@box" in reason
    fresh = plan_expires(NOW - timedelta(minutes=5), 24 * 3600)
    assert expired_plan_reason(planned_record(**{PLAN_EXPIRES: fresh}), NOW, "box") is None
    assert expired_plan_reason(planned_record(**{PLAN_APPLIED: "bo@y [n]"}), NOW, "box") is None
    running = StackRecord(STACK, planned_record().tags, 3)
    assert expired_plan_reason(running, NOW, "box") is None
    pool = {k: v for k, v in planned_record().tags.items() if k != PLANNED_TO}
    assert expired_plan_reason(StackRecord(STACK, pool, 0), NOW, "box") is None  # not a plan's


def test_a_plan_expires_on_the_enforcers_clock_with_slack_for_another_machines() -> None:
    just = planned_record(**{PLAN_EXPIRES: (NOW - timedelta(seconds=10)).isoformat()})
    assert expired_plan_reason(just, NOW, "box") is not None  # the planner's own clock: exact
    assert expired_plan_reason(just, NOW, "other") is None  # another clock: MAX_CLOCK_SKEW later
    assert expired_plan_reason(just, NOW + timedelta(seconds=MAX_CLOCK_SKEW), "other") is not None
