"""Reviewed plans on real Local stacks: ``skyward-iac plan`` creates the pool's stack and saves
the engine's update plan; ``Options(plan=...)`` brings up exactly that stack under
``pulumi up --plan``; a pool that differs is refused before anything is created."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.cli import main
from skyward_iac.infra.stacks.stack import ClusterStack
from skyward_iac.orchestration import plan_file


@sky.function
def rank() -> int:
    return sky.instance_info().node


def test_plan_then_apply_then_refuse_a_changed_spec(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    assert main(["plan", "--provider", "local", "--nodes", "2", "--ttl", "60",
                 "--tag", "team=ml", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    saved = json.loads(out.read_text())
    stack = saved["stack"]
    assert f"stack {stack}: planned changes (" in printed and "$0.0000/h" in printed
    assert "+ " in printed or "create" in printed  # the engine's diff is shown to the reviewer
    planned = {(r["type"], name) for name, r in saved["resources"].items()
               if r["op"] == "create"}
    assert ("pulumi-python:dynamic/skyward:LocalNode", "node-1") in planned
    assert ClusterStack.select(stack).resource_count() == 0  # planned, nothing created yet

    # The spec changed since the review: refused, naming the difference, nothing created.
    with pytest.raises(sky.ConfigError) as refused:
        with sky.Compute(provider=sky.Local(), nodes=3, ttl=60,
                         options=sky.Options(plan=str(out), tags={"team": "ml"})):
            pass
    assert "nodes: 2 -> 3" in str(refused.value) and stack in str(refused.value)
    assert ClusterStack.select(stack).resource_count() == 0

    # The reviewed pool: same stack, every planned resource and nothing else.
    with sky.Compute(provider=sky.Local(), nodes=2, ttl=60,
                     options=sky.Options(plan=str(out), tags={"team": "ml"},
                                         console=False)) as pool:
        assert pool.stack_name == stack
        assert sorted(rank() @ pool) == [0, 1]
        exported = ClusterStack.select(stack)._stack.export_stack().deployment["resources"]
        created = {(r["type"], r["urn"].rsplit("::", 1)[-1]) for r in exported
                   if not r["type"].startswith("pulumi:")}
        assert {(t, n) for t, n in created} == {(t, n) for t, n in planned}
    assert ClusterStack.select(stack).tags()["reviewed_plan"] == saved["digest"]

    # A plan is applied once.
    with pytest.raises(sky.ConfigError, match="was applied already"):
        with sky.Compute(provider=sky.Local(), nodes=2, ttl=60,
                         options=sky.Options(plan=str(out), tags={"team": "ml"})):
            pass


def test_a_missing_plan_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(sky.ConfigError, match="cannot read the plan"):
        with sky.Compute(provider=sky.Local(),
                         options=sky.Options(plan=str(tmp_path / "none.json"))):
            pass


def test_the_engine_holds_the_update_to_its_plan(tmp_path: Path) -> None:
    """Proof that the first ``up`` runs under the saved plan: with node-1 taken out of the
    engine's plan (and the file sealed again, as if the reviewer had approved that), the
    engine refuses to create it, and the pool does not start."""
    out = tmp_path / "plan.json"
    assert main(["plan", "--provider", "local", "--nodes", "2", "--ttl", "60",
                 "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    plans = saved["engine_plan"]["resourcePlans"]
    saved["engine_plan"]["resourcePlans"] = {urn: p for urn, p in plans.items()
                                             if not urn.endswith("::node-1")}
    assert len(saved["engine_plan"]["resourcePlans"]) == len(plans) - 1
    saved["digest"] = plan_file.digest(saved)
    out.write_text(json.dumps(saved))
    with pytest.raises(sky.ProvisionError, match="node-1"):
        with sky.Compute(provider=sky.Local(), nodes=2, ttl=60,
                         options=sky.Options(plan=str(out), console=False)):
            pass
    assert ClusterStack.select(saved["stack"]).resource_count() == 0  # torn down


def test_apply_brings_the_reviewed_pool_up_warm_for_its_user(tmp_path: Path) -> None:
    """``skyward-iac apply`` runs the reviewed plan and leaves the pool warm; the user's
    equal ``sky.Compute`` adopts that very stack."""
    out = tmp_path / "plan.json"
    assert main(["plan", "--provider", "local", "--nodes", "2", "--ttl", "60",
                 "--out", str(out)]) == 0
    stack = json.loads(out.read_text())["stack"]
    digest = json.loads(out.read_text())["digest"]
    assert main(["apply", str(out), "--approved", digest, "--keep-warm", "120"]) == 0
    assert ClusterStack.select(stack).resource_count() >= 3  # up, kept warm
    with sky.Compute(provider=sky.Local(), nodes=2, ttl=60,
                     options=sky.Options(console=False)) as pool:
        assert pool.stack_name == stack
        assert sorted(rank() @ pool) == [0, 1]
    assert ClusterStack.select(stack).resource_count() == 0
