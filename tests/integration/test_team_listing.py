"""The audit of a team's runs on a shared S3 backend (moto's S3 and KMS, the built engine, a real
Local pool): what a run records (where, who, nodes over time, node-hours and USD integrated over
a resize), that every update message names its actor, and that ``history``, ``ls``, ``cost``
and gc over ~50 recorded runs start no engine process at all."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

import skyward_iac as sky
from skyward_iac.cli import main
from skyward_iac.infra.engine import locate as engine
from skyward_iac.infra.engine import state_s3
from skyward_iac.infra.stacks import gc, home, records
from skyward_iac.infra.stacks.stack import ClusterStack, workspace_for_listing
from skyward_iac.infra.stacks.tags import skyward_tags
from tests.s3_server import s3_server, team_state_env
from tests.state_clones import clones, put_s3, s3_objects, template_objects

BUCKET = "team-audit"
RUNS = 50
RATE = 0.5  # USD per node-hour of the template's Local nodes

# The module's fixture brings a pool up, resizes and destroys it on moto's S3: minutes under load.
pytestmark = pytest.mark.timeout(1200)


@sky.function
def answer() -> int:
    return 42


@pytest.fixture(scope="module")
def team() -> Iterator[dict[str, Any]]:
    """A moto server of this module's own (its ~500 objects slow no other test's server), its
    S3 and KMS as the backend, one real run recorded through a pool (1 node, resized to 2,
    closed), and ``RUNS`` copies of it."""
    saved = dict(os.environ)
    with s3_server(timeout=120) as server:  # a loaded machine starts moto slowly
        env = team_state_env(server, BUCKET)
        os.environ.update(env)
        try:
            with sky.Compute(provider=sky.Local(usd_per_hour=RATE), nodes=1,
                             options=sky.Options(console=False, gc_on_start=False,
                                                 tags={"team": "audit"})) as pool:
                assert (answer() >> pool) == 42
                time.sleep(2)
                pool.resize(2)
                time.sleep(2)
                name = pool.stack_name
            client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                                  aws_access_key_id=server.access_key,
                                  aws_secret_access_key=server.secret_key)
            template = template_objects(s3_objects(client, BUCKET), name)
            copies = dict(clones(template, name, RUNS))
            put_s3(client, BUCKET, {k: v for objects in copies.values()
                                    for k, v in objects.items()})
            yield {"template": name, "copies": sorted(copies), "client": client}
        finally:
            os.environ.clear()
            os.environ.update(saved)


#: Lists collecting the programs started while they are in here (``run_cli``).
_watching: list[list[str]] = []


def _started(event: str, args: tuple[Any, ...]) -> None:
    """An audit hook: every program ``subprocess.Popen`` starts (no patching needed)."""
    if event == "subprocess.Popen" and _watching:
        argv = args[1] if isinstance(args[1], list | tuple) else [str(args[1])]
        program = os.path.basename(str(args[0] or (argv[0] if argv else "")))
        for started in _watching:
            started.append(program)


sys.addaudithook(_started)


def run_cli(command: list[str]) -> tuple[Any, list[str]]:
    """``skyward-iac COMMAND`` in this process: its output (parsed with ``--json``) and every
    program it started."""
    started: list[str] = []
    out = io.StringIO()
    _watching.append(started)
    try:
        with contextlib.redirect_stdout(out):
            assert main(command) == 0, command
    finally:
        _watching.remove(started)
    return (json.loads(out.getvalue()) if "--json" in command else out.getvalue()), started


def test_a_run_records_where_who_and_its_nodes_over_time(team: dict[str, Any]) -> None:
    runs, _ = run_cli(["history", "--json", "--limit", "500"])
    [run] = [r for r in runs if r["stack"] == team["template"]]
    assert (run["instance_type"], run["region"], run["market"]) == ("local", "local",
                                                                    "on-demand")
    assert run["actor"] == run["owner"] and run["actor_source"] == "self-declared"
    assert run["tags"] == {"team": "audit"}
    assert [s["nodes"] for s in run["segments"]] == [1, 2]
    assert [s["usd_per_hour"] for s in run["segments"]] == [RATE, 2 * RATE]
    first, second = (s["after_s"] for s in run["segments"])
    assert first == 0 and second >= 2  # the resize came after the first call and a pause
    assert run["live_resources"] == 0 and run["ended_at"]
    # Integrated: 1 node until the resize, 2 after, until the destroy ended.
    duration = run["duration_s"]
    assert run["node_hours"] == pytest.approx((second + 2 * (duration - second)) / 3600,
                                              abs=2e-4)
    assert run["cost_usd"] == pytest.approx(RATE * run["node_hours"], abs=2e-4)
    assert run["node_hours"] > duration / 3600  # more than one node's worth: the resize counted


def test_every_update_message_names_its_actor(team: dict[str, Any]) -> None:
    found = engine.find_engine()
    shown = subprocess.run(
        [str(found.binary), "stack", "history", "--stack",
         f"organization/skyward/{team['template']}", "--json"],
        check=False, capture_output=True, text=True, timeout=300, cwd=home.workspace_dir(),
        env={**os.environ, **engine.engine_env(found)})
    assert shown.returncode == 0, shown.stderr
    updates = json.loads(shown.stdout)
    assert {u["kind"] for u in updates} >= {"update", "destroy"}
    owner = ClusterStack.select(team["template"]).tags()["owner"]
    for update in updates:  # plain `pulumi stack history` says who did what and why
        assert owner in update["message"], update["message"]
        assert update["message"].startswith("skyward"), update["message"]
        if update["kind"] == "update":
            assert update["message"].endswith(f"(actor: {owner}, self-declared)"), update


def test_listing_fifty_runs_starts_no_engine(team: dict[str, Any]) -> None:
    names = {team["template"], *team["copies"]}
    for command in (["history", "--json", "--limit", "500"], ["ls", "--json"],
                    ["cost", "--json", "--by", "tag:team"], ["gc", "--dry-run", "--json"]):
        out, started = run_cli(command)
        assert not [p for p in started if "pulumi" in p], (command, started)
        if command[0] == "history":
            assert {r["stack"] for r in out} >= names
            copies = [r for r in out if r["stack"] in team["copies"]]
            assert all(r["instance_type"] == "local" and r["node_hours"] > 0 for r in copies)
        if command[0] == "cost":
            groups = {g["group"]: g for g in out["groups"]}
            assert groups["audit"]["runs"] == 1
            assert groups["ml"]["runs"] + groups["infra"]["runs"] == RUNS
            assert out["total"]["cost_usd"] == pytest.approx(
                sum(g["cost_usd"] for g in out["groups"]), abs=1e-3)
        if command[0] == "gc":
            assert not [a for a in out if a["stack"] in names]  # every run is over
    assert records.cache_file(os.environ["SKYWARD_BACKEND_URL"]).is_file()
    assert not [a for a in gc.collect(dry_run=True) if a.stack in names]


def test_the_engine_reads_the_copies_as_the_direct_reader_does(team: dict[str, Any]) -> None:
    """The copies are stacks to the engine too, and the engine's view of a run's tags and
    history is the direct reader's."""
    stored = {s.name: s for s in records.stored_stacks(updates=True) or []}
    assert set(team["copies"]) <= set(stored)
    copy = team["copies"][0]
    workspace = ClusterStack.select(copy)
    assert workspace.tags() == skyward_tags(stored[copy].tags)
    engine_view = [(u.kind, u.result, u.message) for u in workspace.history()]
    assert engine_view == [(u.kind, u.result, u.message) for u in stored[copy].updates]
    assert workspace.resource_count() == stored[copy].resource_count == 0
    listed = {s.name.rsplit("/", 1)[-1] for s in workspace_for_listing().list_stacks()}
    assert set(team["copies"]) <= listed


def test_a_new_machine_reads_the_teams_shared_summaries(
        team: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The team's first look reads every run but the checkpoint of a run the engine destroyed
    (its history shows it empty) and shares what it read; a new machine's first look then
    reads no run's objects, and lists the same."""
    client, url = team["client"], os.environ["SKYWARD_BACKEND_URL"]
    shared = state_s3.SHARED.format(project=records.PROJECT)
    client.delete_object(Bucket=BUCKET, Key=shared)
    read: list[str] = []

    def reading(params: dict[str, Any], **_: Any) -> None:
        read.append(params["Key"])

    events = state_s3._client(state_s3.location(url)).meta.events
    events.register("before-parameter-build.s3.GetObject", reading)
    try:
        monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "first"))
        first, _ = run_cli(["history", "--json", "--limit", "500"])
        assert f".pulumi/stacks/{records.PROJECT}/{team['template']}.pulumi-tags" in read
        assert f".pulumi/stacks/{records.PROJECT}/{team['template']}.json" not in read
        client.head_object(Bucket=BUCKET, Key=shared)
        read.clear()
        monkeypatch.setenv("SKYWARD_HOME", str(tmp_path / "new"))
        again, _ = run_cli(["history", "--json", "--limit", "500"])
    finally:
        events.unregister("before-parameter-build.s3.GetObject", reading)
    assert shared in read
    assert not [key for key in read if key.startswith((".pulumi/stacks/", ".pulumi/history/"))]
    assert again == first
