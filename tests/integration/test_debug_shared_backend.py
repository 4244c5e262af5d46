"""``skyward-iac ssh`` and ``cp`` from "another machine" of the team: a process with its own
empty skyward home (its own passphrase, which opens nothing of the pool's; no state of its own)
that shares only the S3 backend and the KMS key (moto on loopback) with the pool's owner. The stack's SSH key comes out of the shared
state as a KMS-encrypted secret, and the access log lands there too."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.infra.stacks.stack import ClusterStack
from tests.s3_server import S3Server, team_state_env

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def team(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    env = team_state_env(server, "debug-team-state")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    yield env


def test_a_teammate_reaches_the_nodes_through_the_shared_backend(
        team: dict[str, str], tmp_path: Path) -> None:
    elsewhere = {**os.environ, **team, "SKYWARD_HOME": str(tmp_path / "teammate-home"),
                 "PYTHONPATH": str(ROOT)}
    elsewhere.pop("PULUMI_CONFIG_PASSPHRASE", None)
    with sky.Compute(provider=sky.Local(), nodes=2,
                     options=sky.Options(console=False, gc_on_start=False)) as pool:
        ran = subprocess.run(
            [sys.executable, "-m", "skyward_iac.cli", "ssh", pool.stack_name, "--node", "1",
             "-n", "--", "echo $SKYWARD_LOCAL_SANDBOX; hostname"],
            env=elsewhere, capture_output=True, text=True, timeout=240, cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr
        sandbox, host = ran.stdout.splitlines()
        assert sandbox.endswith(f"{pool.stack_name}/node-1") and host == socket.gethostname()
        (tmp_path / "hello.txt").write_text("from a teammate\n")
        copied = subprocess.run(
            [sys.executable, "-m", "skyward_iac.cli", "cp", "hello.txt",
             f"{pool.stack_name}:1:hello.txt"],
            env=elsewhere, capture_output=True, text=True, timeout=240, cwd=tmp_path)
        assert copied.returncode == 0, copied.stderr
        assert Path(sandbox, "work", "hello.txt").read_text() == "from a teammate\n"
        logged = [key for key in ClusterStack.select(pool.stack_name).tags()
                  if key.startswith("access.")]
        assert len(logged) == 2, logged  # both recorded in the shared backend
