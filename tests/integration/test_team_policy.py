"""The team policy in the backend with the real engine: pushed on machine A to a moto S3
backend, it refuses machine B's pool although B sets ``SKYWARD_POLICY=empty.toml``; a local
rule stricter than the team's still applies; a plan made under a laxer policy is refused at
``apply``, before anything is created (S3 and file backends). Two skyward homes stand for two
machines; the CLI runs as a separate process where a user would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

import skyward_iac as sky
from skyward_iac.cli import main
from skyward_iac.infra.capacity import policy, team_policy
from skyward_iac.infra.stacks import home
from skyward_iac.infra.stacks.stack import ClusterStack
from tests.s3_server import S3Server, team_state_env

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "team-policy-state"  # its own bucket: the session's server outlives this module


def skyward_iac(cwd: Path, machine: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``skyward-iac ARGS`` on ``machine`` (its own skyward home), as a process of its own."""
    return subprocess.run([sys.executable, "-m", "skyward_iac.cli", *args], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(ROOT),
                               "SKYWARD_HOME": str(machine)},
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          check=False)


@pytest.fixture
def s3_team(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """Pools of this test use an S3 backend and KMS key on moto; the policy object is removed
    afterwards."""
    env = team_state_env(server, BUCKET)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(policy.POLICY_ENV, raising=False)
    s3 = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                      aws_access_key_id=server.access_key,
                      aws_secret_access_key=server.secret_key)
    yield {**env, "endpoint": server.endpoint}
    s3.delete_object(Bucket=BUCKET, Key=team_policy.KEY)


def keys(team: dict[str, str]) -> set[str]:
    s3 = boto3.client("s3", endpoint_url=team["endpoint"], region_name="us-east-1",
                      aws_access_key_id=team["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=team["AWS_SECRET_ACCESS_KEY"])
    return {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])}


def test_machine_b_cannot_weaken_the_policy_machine_a_pushed(
        s3_team: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    machine_a, machine_b = tmp_path / "a", tmp_path / "b"
    team = tmp_path / "team.toml"
    team.write_text('[policy]\nmax_nodes = 1\nallowed_providers = ["local", "aws"]\n')
    pushed = skyward_iac(tmp_path, machine_a, "policy", "push", "team.toml")
    assert pushed.returncode == 0, pushed.stderr
    assert "(aws-sts)" in pushed.stdout  # the pusher's caller identity, from STS
    assert team_policy.KEY in keys(s3_team)
    (tmp_path / "sub").mkdir()  # a relative path from another directory names the same file
    same = skyward_iac(tmp_path / "sub", machine_a, "policy", "diff", "../team.toml")
    assert same.returncode == 0, same.stderr
    assert f"-> {team}:" in same.stdout and "no rule changes" in same.stdout, same.stdout

    # Machine B: its own home, an empty SKYWARD_POLICY, and no way to lift the team rule.
    monkeypatch.setenv("SKYWARD_HOME", str(machine_b))
    (tmp_path / "empty.toml").write_text("[policy]\n")
    monkeypatch.setenv(policy.POLICY_ENV, str(tmp_path / "empty.toml"))
    before = keys(s3_team)
    with pytest.raises(policy.PolicyError) as refused:  # the pool is planned on construction
        sky.Compute(provider=sky.Local(), nodes=2, options=sky.Options(console=False))
    assert (f"policy.max_nodes (team policy s3://{BUCKET}/{team_policy.KEY}, pushed by arn:"
            in str(refused.value)), refused.value
    assert keys(s3_team) == before, "a refused pool wrote to the backend"

    shown = skyward_iac(tmp_path, machine_b, "policy", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["team"]["rules"]["max_nodes"] == 1
    assert report["team"]["pushed_by"].startswith("arn:aws:")

    # A local rule stricter than the team's still applies.
    project = tmp_path / "project"
    project.mkdir()
    (project / "skyward.toml").write_text("[policy]\nmax_ttl = 120\n")
    monkeypatch.chdir(project)
    with pytest.raises(policy.PolicyError, match=r"policy.max_ttl \(.*skyward.toml\)"):
        sky.Compute(provider=sky.Local(), nodes=1, ttl=600, options=sky.Options(console=False))


@pytest.mark.parametrize("backend", ["s3", "file"])
def test_apply_refuses_a_plan_made_under_a_laxer_policy(
        backend: str, server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    if backend == "s3":
        for name, value in team_state_env(server, BUCKET).items():
            monkeypatch.setenv(name, value)
    else:
        monkeypatch.setenv("SKYWARD_BACKEND_URL", f"file://{tmp_path / 'team-state'}")
    monkeypatch.delenv(policy.POLICY_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    lax, strict = tmp_path / "lax.toml", tmp_path / "strict.toml"
    lax.write_text("[policy]\nmax_nodes = 4\n")
    strict.write_text("[policy]\nmax_nodes = 1\n")
    try:
        assert main(["policy", "push", str(lax)]) == 0
        out = tmp_path / "plan.json"
        assert main(["plan", "--provider", "local", "--nodes", "2", "--ttl", "60",
                     "--out", str(out)]) == 0
        document = json.loads(out.read_text())
        assert main(["policy", "push", str(strict)]) == 0
        capsys.readouterr()
        code = main(["apply", str(out), "--approved", document["digest"], "--keep-warm", "1"])
        err = capsys.readouterr().err
        assert code == 1 and "policy.max_nodes (team policy" in err, err
        assert "grow to 2 nodes, over the limit of 1" in err
        stack = ClusterStack.select(document["stack"])
        assert stack.resource_count() == 0, "resources were created by a refused apply"
        assert [u.kind for u in stack.history()].count("update") == 0
        assert not (home.local_nodes_dir() / document["stack"]).exists()
    finally:
        team_policy.push({})  # leave the shared bucket without rules for the next test
