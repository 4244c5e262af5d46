"""A pool whose stack lives in a shared S3 backend with secrets under KMS: moto's S3 and KMS on
loopback, the real engine, a real Local pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

import skyward_iac as sky
from skyward_iac.cli import main
from skyward_iac.infra.engine import locate as engine
from skyward_iac.infra.stacks import gc
from skyward_iac.infra.stacks.stack import list_records
from tests.s3_server import S3Server, s3_server, team_state_env

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "team-state"


@sky.function
def answer() -> int:
    return 42


@pytest.fixture
def team_backend(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """This session's pools use an S3 backend and an awskms:// key, both on moto."""
    env = team_state_env(server, BUCKET)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    yield {**env, "endpoint": server.endpoint}


def state_objects(team: dict[str, str]) -> dict[str, bytes]:
    """Every object of the backend bucket, by key."""
    s3 = boto3.client("s3", endpoint_url=team["endpoint"], region_name="us-east-1",
                      aws_access_key_id=team["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=team["AWS_SECRET_ACCESS_KEY"])
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    return {k: s3.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys}


def test_a_pool_lives_in_the_shared_backend_with_kms_secrets(team_backend: dict[str, str]
                                                             ) -> None:
    with sky.Compute(provider=sky.Local(), nodes=1,
                     options=sky.Options(console=False, gc_on_start=False)) as pool:
        assert (answer() >> pool) == 42
        name = pool.stack_name
        live = {r.name: r.resource_count for r in list_records()}
        assert live.get(name, 0) > 0, "the pool's stack is not listed from the S3 backend"
        listed = subprocess.run([sys.executable, "-m", "skyward_iac.cli", "ls", "--json"],
                                capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert listed.returncode == 0, listed.stderr
        assert name in listed.stdout  # `skyward-iac ls` (another process) sees it too
        [row] = [r for r in json.loads(listed.stdout) if r["stack"] == name]
        shown = subprocess.run([sys.executable, "-m", "skyward_iac.cli", "show", name, "--json"],
                               capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert shown.returncode == 0, shown.stderr
        assert row["resources"] == json.loads(shown.stdout)["resources"] > 0  # counted alike
        assert row["usd_per_hour"] == 0.0  # the rate column (Local costs nothing)
        exported = subprocess.run(
            [str(engine.find_engine().binary), "stack", "export", "--stack",
             f"organization/skyward/{name}", "--show-secrets=false"],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
            env={**os.environ, **engine.engine_env(engine.find_engine())},
        )
        assert exported.returncode == 0, exported.stderr
        state = json.loads(exported.stdout)
        assert "awskms://" in json.dumps(state["deployment"]["secrets_providers"])
        objects = state_objects(team_backend)
        assert any(name in key for key in objects), sorted(objects)
        # No key material or token in plaintext anywhere in the backend.
        for key, body in objects.items():
            assert b"PRIVATE KEY" not in body, f"plaintext private key in {key}"
    assert {r.name: r.resource_count for r in list_records()}[name] == 0


def test_a_backend_outage_says_what_to_check_not_a_traceback() -> None:
    with s3_server() as gone:
        env = {**os.environ, **team_state_env(gone, "outage"), "PYTHONPATH": str(ROOT)}
    for command in (["ls"], ["history"], ["down", "some-stack"], ["gc"]):
        done = subprocess.run([sys.executable, "-m", "skyward_iac.cli", *command], env=env,
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert done.returncode == 1, (command, done.stdout)
        assert "Traceback" not in done.stderr, done.stderr
        assert "cannot be reached (dial tcp" in done.stderr and "s3://outage" in done.stderr
        assert "run the command again" in done.stderr


def test_gc_removes_an_expired_plans_stack_from_the_shared_backend(
        team_backend: dict[str, str], tmp_path: Path) -> None:
    """On a backend gc cannot read as files, the stacks of plans are found by their
    ``plan_expires`` tag (one filtered listing) and removed once expired."""
    out = tmp_path / "plan.json"
    assert main(["plan", "--provider", "local", "--ttl", "60", "--plan-ttl", "1",
                 "--out", str(out)]) == 0
    stack = json.loads(out.read_text())["stack"]
    assert stack in {r.name for r in list_records(only_live=True)}
    time.sleep(2)
    actions = [a for a in gc.collect() if a.stack == stack]
    assert [a.action for a in actions] == ["removed"], actions
    assert stack not in {r.name for r in list_records()}
