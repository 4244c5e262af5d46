"""Sealed plans with the real engine and real Local pools: ``skyward-iac plan`` from any working
directory, ``apply --approved DIGEST``, edits refused before any resource or node process
exists, a plan applied once (warm or racing), plans that expire, and plan files that diff
without noise. The CLI runs as a separate process, as a user runs it."""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.cli import main
from skyward_iac.infra.stacks import home
from skyward_iac.infra.stacks.stack import ClusterStack, list_records
from skyward_iac.orchestration import plan_file
from tests.helpers import stored_resource_count

ROOT = Path(__file__).resolve().parents[2]


def skyward_iac(cwd: Path, *args: str, env: dict[str, str] | None = None
                ) -> subprocess.CompletedProcess[str]:
    """``skyward-iac ARGS`` run from ``cwd`` in a process of its own."""
    return subprocess.run([sys.executable, "-m", "skyward_iac.cli", *args], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          check=False)


def make_plan(cwd: Path, out: str, *flags: str) -> dict[str, Any]:
    done = skyward_iac(cwd, "plan", "--provider", "local", "--ttl", "60", *flags, "--out", out)
    assert done.returncode == 0, done.stderr
    document = json.loads((cwd / out).read_text())
    assert f"--approved {document['digest']}" in done.stdout  # printed for the reviewer
    return document


def stacks() -> set[str]:
    return {record.name for record in list_records()}


def sandbox(stack: str) -> Path:
    """Where a Local node of ``stack`` would run (exists once any node process started)."""
    return home.local_nodes_dir() / stack


def test_every_path_argument_relative_or_absolute_from_another_directory(tmp_path: Path) -> None:
    work, plans, other = tmp_path / "work", tmp_path / "plans", tmp_path / "other"
    for directory in (work, plans, other):
        directory.mkdir()
    relative = make_plan(work, "../plans/rel.json")  # the way everyone types it
    absolute = make_plan(work, str(plans / "abs.json"))
    assert (plans / "rel.json").is_file() and (plans / "abs.json").is_file()
    leftovers = [p for d in (work, plans, home.workspace_dir(), home.skyward_home() / "plans")
                 for p in d.iterdir() if "engine" in p.name or p.name.endswith(".tmp")]
    assert not leftovers, leftovers
    assert ClusterStack.select(relative["stack"]).tags()["planned_to"] == str(plans / "rel.json")

    # apply from yet another directory, by relative and by absolute path.
    for path, document in (("../plans/rel.json", relative), (str(plans / "abs.json"), absolute)):
        done = skyward_iac(other, "apply", path, "--approved", document["digest"],
                           "--keep-warm", "1")
        assert done.returncode == 0, done.stderr
        assert [u.kind for u in ClusterStack.select(document["stack"]).history()
                ].count("update") == 1

    # A policy file named relative to the caller's directory is the one read.
    (work / "team.toml").write_text("[policy]\nmax_nodes = 1\n")
    before = stacks()
    refused = skyward_iac(work, "plan", "--provider", "local", "--nodes", "2", "--out", "p.json",
                          env={"SKYWARD_POLICY": "team.toml"})
    assert refused.returncode == 1 and str(work / "team.toml") in refused.stderr, refused.stderr
    assert stacks() == before and not (work / "p.json").exists()


def test_a_relative_home_and_engine_root_name_the_same_directories_from_anywhere(
        tmp_path: Path) -> None:
    """SKYWARD_HOME and SKYWARD_PULUMI_ROOT typed relative to the caller's directory: the plan
    (whose engine runs in the home's workspace) and a later look from elsewhere use them."""
    from skyward_iac.infra.engine import locate as engine

    work, other = tmp_path / "work", tmp_path / "other" / "deeper"
    work.mkdir()
    other.mkdir(parents=True)
    root = engine.find_engine().root

    def env(cwd: Path) -> dict[str, str]:
        return {"SKYWARD_HOME": os.path.relpath(tmp_path / "home", cwd),
                "SKYWARD_PULUMI_ROOT": os.path.relpath(root, cwd),
                "SKYWARD_BACKEND_URL": "", "SKYWARD_SECRETS_PROVIDER": ""}

    done = skyward_iac(work, "plan", "--provider", "local", "--ttl", "60", "--out", "p.json",
                       env=env(work))
    assert done.returncode == 0, done.stderr
    stack = json.loads((work / "p.json").read_text())["stack"]
    assert list((tmp_path / "home").rglob(f"{stack}.json")), "not in the relative home's state"
    assert not (work / "home").exists() and not list(work.rglob("Pulumi.*.yaml"))
    shown = skyward_iac(other, "show", stack, "--json", env=env(other))
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["resources"] == 0  # planned, nothing created


@pytest.mark.parametrize("out", ["missing/plan.json", ".", "x" * 300 + ".json"])
def test_a_failed_plan_leaves_no_stack_and_no_file(tmp_path: Path, out: str) -> None:
    before = stacks()
    done = skyward_iac(tmp_path, "plan", "--provider", "local", "--out", out)
    assert done.returncode == 1, done.stdout
    assert "Traceback" not in done.stderr and done.stderr.startswith("skyward-iac: ")
    assert stacks() == before
    assert [p.name for p in tmp_path.iterdir()] == []


EDITS: dict[str, Callable[[dict[str, Any]], Any]] = {
    "tags": lambda d: d["facts"]["tags"].update(team="ops"),
    "usd_per_hour": lambda d: d.update(usd_per_hour=0.0001),
    "resources": lambda d: d["resources"].pop("node-0"),
    "nodes": lambda d: d["facts"].update(nodes=2),
    "engine plan": lambda d: d["engine_plan"]["resourcePlans"].popitem(),
}


def test_an_edited_plan_is_refused_before_anything_runs_and_the_plan_applies_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = make_plan(tmp_path, "plan.json", "--tag", "team=ml")
    stack, digest = document["stack"], document["digest"]
    edited_file = str(tmp_path / "edited.json")
    for what, edit in EDITS.items():
        edited = json.loads(json.dumps(document))
        edit(edited)
        (tmp_path / "edited.json").write_text(json.dumps(edited, indent=2))
        code = main(["apply", edited_file, "--approved", digest])  # in this process: quicker
        err = capsys.readouterr().err
        assert code == 1 and "changed after" in err, (what, err)
        with pytest.raises(sky.ConfigError, match="changed after"):  # the Python API too
            sky.Compute(provider=sky.Local(), ttl=60, options=sky.Options(
                plan=str(tmp_path / "edited.json"), tags={"team": "ml"}))
        # Sealed again by whoever edited it: still not the approved plan.
        edited["digest"] = plan_file.digest(edited)
        (tmp_path / "edited.json").write_text(json.dumps(edited))
        code = main(["apply", edited_file, "--approved", digest])
        err = capsys.readouterr().err
        assert code == 1 and "not the approved plan" in err, (what, err)
    assert ClusterStack.select(stack).resource_count() == 0
    assert not sandbox(stack).exists(), "a node process was started"
    assert ClusterStack.select(stack).history() == []  # not even a failed update

    applied = skyward_iac(tmp_path, "apply", "plan.json", "--approved", digest,
                          "--keep-warm", "60")
    assert applied.returncode == 0, applied.stderr
    assert ClusterStack.select(stack).resource_count() >= 2 and sandbox(stack).exists()
    try:
        # Applied once, even while its pool is warm for adoption.
        again = skyward_iac(tmp_path, "apply", "plan.json", "--approved", digest)
        assert again.returncode == 1 and "was applied already" in again.stderr, again.stderr
        with pytest.raises(sky.ConfigError, match="was applied already"), sky.Compute(
                provider=sky.Local(), ttl=60, options=sky.Options(
                    plan=str(tmp_path / "plan.json"), tags={"team": "ml"}, console=False)):
            pass
        history = ClusterStack.select(stack).history()
        assert [u.kind for u in history].count("update") == 1
        assert digest in (history[-1].message or "")  # the update names the plan it ran
    finally:
        skyward_iac(tmp_path, "down", stack, "--force")
    assert ClusterStack.select(stack).resource_count() == 0


def test_two_applies_at_once_apply_the_plan_once(tmp_path: Path) -> None:
    document = make_plan(tmp_path, "plan.json")
    stack = document["stack"]
    command = [sys.executable, "-m", "skyward_iac.cli", "apply", "plan.json", "--approved",
               document["digest"], "--keep-warm", "5"]
    racers = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                               env={**os.environ, "PYTHONPATH": str(ROOT)}) for _ in range(2)]
    results = [(r.wait(300), *r.communicate()) for r in racers]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 1], results
    loser = next(err for code, _, err in results if code == 1)
    assert "applied" in loser or "locked" in loser, loser
    history = ClusterStack.select(stack).history()
    first = plan_file.first_applier((u.kind, u.message or "") for u in history)
    assert first is not None and document["digest"] in first
    deadline = time.monotonic() + 180  # the winner's keeper destroys it after --keep-warm
    while stored_resource_count(stack):  # the checkpoint: no engine start a look
        assert time.monotonic() < deadline, "the applied pool was never destroyed"
        time.sleep(2)
    assert ClusterStack.select(stack).resource_count() == 0


def test_an_unapplied_plan_expires_and_gc_removes_its_stack(tmp_path: Path) -> None:
    kept = make_plan(tmp_path, "kept.json")
    short = make_plan(tmp_path, "short.json", "--plan-ttl", "1")
    assert short["expires_at"] < kept["expires_at"]
    time.sleep(2)
    done = skyward_iac(tmp_path, "apply", "short.json", "--approved", short["digest"])
    assert done.returncode == 1 and "expired" in done.stderr, done.stderr
    collected = skyward_iac(tmp_path, "gc", "--json")
    assert collected.returncode == 0, collected.stderr
    actions = {a["stack"]: a for a in json.loads(collected.stdout)}
    assert actions[short["stack"]]["action"] == "removed"
    assert "nobody applied" in actions[short["stack"]]["reason"]
    assert kept["stack"] not in actions  # its plan has not expired
    assert short["stack"] not in stacks() and kept["stack"] in stacks()


def test_two_plans_of_similar_pools_diff_without_noise(tmp_path: Path) -> None:
    a = make_plan(tmp_path, "a.json", "--nodes", "2")
    b = make_plan(tmp_path, "b.json", "--nodes", "3")
    text_a, text_b = (tmp_path / "a.json").read_text(), (tmp_path / "b.json").read_text()
    assert text_a.count(a["stack"]) == 1 and text_b.count(b["stack"]) == 1  # once, at the top
    changed = [line for line in difflib.unified_diff(text_a.splitlines(), text_b.splitlines(),
                                                     lineterm="", n=0)
               if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert any('"nodes": 3' in line for line in changed)
    assert any('"node-2"' in line for line in changed)  # the resource it adds, by name
    noisy = [line for line in changed if a["stack"] in line or b["stack"] in line]
    assert [line.split(":")[0].strip("+- ") for line in noisy] == ['"stack"', '"stack"']
