"""A plan made on one machine of the team and applied on another, sharing only the S3 backend
and the secrets: the applier's machine never had the stack's secrets settings, so they come
from the stack's state (``infra/stacks/stack_secrets.py``). Before, B's apply made a data key
of its own and failed on the plan's secrets (``cipher: message authentication failed``),
consuming the plan.

"Machines" as in test_team_leases.py (a hostname of its own), and B's skyward home is its own
empty directory mounted at the same path as A's (a mount namespace): a Local plan names the
sandbox directory and the user of its nodes, as two team machines with the same layout would
share them. A Local plan applied by another user or under another home is refused before
anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.test_team_leases import ROOT, skyward_iac
from tests.s3_server import s3_server, team_state_env

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a second hostname needs `unshare --uts`, which needs root")


def settings(home: Path, stack: str) -> dict[str, str]:
    return yaml.safe_load((home / "workspace" / f"Pulumi.{stack}.yaml").read_text())


def on_b(env: dict[str, str], b_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``skyward-iac ARGS`` on machine B: its own hostname, and its own home directory
    mounted where A's is."""
    command = " ".join(f"'{part}'" for part in [sys.executable, "-m", "skyward_iac.cli", *args])
    script = (f"mount --bind '{b_dir}' '{env['SKYWARD_HOME']}' && hostname machine-b && "
              f"exec {command}")
    return subprocess.run(["unshare", "--uts", "--mount", "sh", "-c", script], env=env,
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          stdin=subprocess.DEVNULL, check=False)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("secrets", ["awskms", "passphrase"])
def test_a_plan_made_on_a_applies_on_b(tmp_path: Path, secrets: str) -> None:
    with s3_server() as server:
        state = team_state_env(server, f"plans-{secrets}")
        if secrets == "passphrase":
            state.pop("SKYWARD_SECRETS_PROVIDER")
            state["PULUMI_CONFIG_PASSPHRASE"] = "team-shared-passphrase"
        env = {**os.environ, **state, "PYTHONPATH": str(ROOT),
               "SKYWARD_HOME": str(tmp_path / "home")}
        b_dir = tmp_path / "b-home"
        b_dir.mkdir()
        out = tmp_path / "plan.json"
        made = skyward_iac(env, "machine-a", "plan", "--provider", "local", "--ttl", "60",
                           "--out", str(out))
        assert made.returncode == 0, made.stderr
        plan = json.loads(out.read_text())
        stack = plan["stack"]
        try:
            applied = on_b(env, b_dir, "apply", str(out), "--approved", plan["digest"],
                           "--keep-warm", "20")
            assert applied.returncode == 0, applied.stderr[-3000:]
            # B opens the stack's secrets as A wrote them, not with a key of its own.
            theirs, mine = settings(tmp_path / "home", stack), settings(b_dir, stack)
            for key in ("secretsprovider", "encryptedkey", "encryptionsalt"):
                assert theirs.get(key) == mine.get(key), key
            assert mine.get("encryptedkey" if secrets == "awskms" else "encryptionsalt")
            again = skyward_iac(env, "machine-a", "apply", str(out), "--approved",
                                plan["digest"])
            assert again.returncode != 0 and "applied already" in again.stderr, again.stderr
        finally:
            # B's nodes live in B's mount namespace: B takes them down (its keeper may be
            # destroying them already, holding the stack's lock meanwhile).
            for _ in range(30):
                down = on_b(env, b_dir, "down", stack, "--force", "--reason", "test over")
                if "locked by a running update" not in down.stderr:
                    break
                time.sleep(3)
            assert down.returncode == 0, down.stderr[-3000:]


@pytest.mark.timeout(600)
def test_a_local_plan_applied_under_another_home_is_refused_and_stays_applicable(
        tmp_path: Path) -> None:
    with s3_server() as server:
        state = team_state_env(server, "plans-elsewhere")
        env = {**os.environ, **state, "PYTHONPATH": str(ROOT),
               "SKYWARD_HOME": str(tmp_path / "home")}
        out = tmp_path / "plan.json"
        made = skyward_iac(env, "machine-a", "plan", "--provider", "local", "--ttl", "60",
                           "--out", str(out))
        assert made.returncode == 0, made.stderr
        plan = json.loads(out.read_text())
        other = {**env, "SKYWARD_HOME": str(tmp_path / "other")}
        refused = skyward_iac(other, "machine-b", "apply", str(out), "--approved",
                              plan["digest"])
        assert refused.returncode != 0
        assert (f"runs its nodes as {os.environ.get('USER', 'root')} under "
                f"{tmp_path / 'home' / 'local'}") in refused.stderr, refused.stderr[-2000:]
        assert "nothing was created" in refused.stderr
        assert not (tmp_path / "other" / "local" / plan["stack"]).exists()
        # Refused before the plan was claimed: where it was made, it still applies.
        applied = skyward_iac(env, "machine-a", "apply", str(out), "--approved",
                              plan["digest"], "--keep-warm", "5")
        assert applied.returncode == 0, applied.stderr[-3000:]
        for _ in range(30):
            down = skyward_iac(env, "machine-a", "down", plan["stack"], "--force", "--reason",
                               "test over")
            if "locked by a running update" not in down.stderr:
                break
            time.sleep(3)
        assert down.returncode == 0, down.stderr[-3000:]
