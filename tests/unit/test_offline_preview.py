"""Estimates without an account: ``skyward-iac preview`` and ``plan`` for AWS and GCP on a machine
with no provider plugin and no credentials run the stack's real program under Pulumi mocks and
print every resource it declares, its key inputs and the catalog's estimate, marked offline;
an offline plan is sealed and readable but ``apply`` refuses it before anything exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import skyward_iac as sky
from skyward_iac.cli import main
from skyward_iac.infra.capacity import offers
from skyward_iac.infra.programs.key_inputs import SECRET, key_inputs
from skyward_iac.infra.programs.offline import CALLER_LABEL, looked_up
from skyward_iac.infra.stacks import home
from skyward_iac.orchestration.offline_preview import OFFLINE, OfflinePreview, offline_reason
from skyward_iac.orchestration.preview import preview

ROOT = Path(__file__).resolve().parents[2]
AWS_NODE, GCP_NODE = "aws:ec2/instance:Instance", "gcp:compute/instance:Instance"
UBUNTU_AMI = "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*"
# pulumi_aws warns about its own deprecated resources when the ec2 module loads.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def account_free_env(home_dir: Path) -> dict[str, str]:
    """The environment of a laptop with no cloud account: no credentials in the environment,
    no AWS or gcloud config, no instance metadata; a skyward home without provider plugins."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "GOOGLE_", "CLOUDSDK_", "GCLOUD_"))}
    return {**env, "HOME": str(home_dir), "SKYWARD_HOME": str(home_dir / "skyward"),
            "AWS_CONFIG_FILE": str(home_dir / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(home_dir / "none"),
            "AWS_EC2_METADATA_DISABLED": "true", "CLOUDSDK_CONFIG": str(home_dir / "gcloud"),
            "PYTHONPATH": str(ROOT)}


@pytest.fixture
def no_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process as ``account_free_env`` describes (the session's skyward home kept: it
    holds no plugin either)."""
    env = account_free_env(tmp_path)
    for key in [k for k in os.environ if k not in env]:
        monkeypatch.delenv(key)
    for key in ("HOME", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
                "AWS_EC2_METADATA_DISABLED", "CLOUDSDK_CONFIG"):
        monkeypatch.setenv(key, env[key])
    for provider in ("aws", "gcp"):
        assert offline_reason(provider) is not None, f"{provider} could preview for real here"
    return tmp_path


def stack_files() -> list[Path]:
    return sorted(p for p in home.skyward_home().rglob("*") if p.is_file())


def test_aws_preview_from_the_cli_lists_every_resource_and_the_estimate(tmp_path: Path) -> None:
    """``skyward-iac preview`` as a user runs it: its own process, no plugin, no account."""
    done = subprocess.run(
        [sys.executable, "-m", "skyward_iac.cli", "preview", "--provider", "aws", "--nodes",
         "3", "--vcpus", "2", "--memory-gb", "4", "--allocation", "spot", "--hours", "2"],
        env=account_free_env(tmp_path), cwd=tmp_path, capture_output=True, text=True,
        timeout=300, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    choice = offers.select([sky.Spec(provider=sky.AWS(), vcpus=2, memory_gb=4, nodes=3,
                                     allocation="spot")])
    assert out.startswith(f"{OFFLINE} (")
    assert "pulumi-resource-aws" in out and "plugin install resource aws" in out  # how to fix
    nodes = [line.split()[-1] for line in out.splitlines() if line.strip().startswith(AWS_NODE)]
    assert nodes == ["node-0", "node-1", "node-2"]
    assert out.count(f"instance_type: {choice.offer.instance_type}") == 1  # node-0 in full,
    assert out.count("(inputs as node-0)") == 2                           # the others alike
    assert "market: spot" in out and f"the newest AMI named {UBUNTU_AMI!r}" in out
    assert f"peer: {CALLER_LABEL}" in out  # no ssh_cidr: the SSH rule's source comes at apply
    hourly = choice.hourly * 3
    assert (f"estimated cost: ${hourly:.4f}/h{offers.ESTIMATE}, ${hourly * 2:.2f} for 2 h"
            in out)
    assert f"catalog {offers.current_catalog('aws').describe()}" in out
    assert "(est.): a typical spot price" in out
    assert "PRIVATE KEY" not in out + done.stderr
    state = tmp_path / "skyward" / "state"
    assert not [p for p in state.rglob("*") if p.is_file()]  # no stack in the backend


def test_gcp_preview_json(no_account: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = stack_files()
    code = main(["preview", "--provider", "gcp", "--nodes", "2", "--accelerator", "T4",
                 "--allocation", "spot", "--project", "team-ml", "--ssh-cidr",
                 "203.0.113.0/24", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    spec = sky.Spec(provider=sky.GCP(project="team-ml"), accelerator=sky.accelerators.T4(),
                    nodes=2, allocation="spot")
    choice = offers.select([spec])
    assert report["offline"] is True and report["note"] == OFFLINE
    assert "pulumi-resource-gcp" in report["reason"]
    assert report["nodes"] == 2 and report["offer"]["instance_type"] == choice.offer.instance_type
    nodes = [r for r in report["resources"] if r["type"] == GCP_NODE]
    assert [r["name"] for r in nodes] == ["node-0", "node-1"]
    for node in nodes:
        inputs = node["inputs"]
        assert inputs["instance_type"] == choice.offer.machine_type
        assert inputs["market"] == "spot" and inputs["zone"] == choice.offer.zones[0]
        assert inputs["accelerators"] == ["1x nvidia-tesla-t4"]
        assert inputs["image"].startswith("at apply: the newest image of family "
                                          "ubuntu-accelerator-2204")
    (provider,) = [r for r in report["resources"] if r["type"] == "pulumi:providers:gcp"]
    assert provider["inputs"]["project"] == "team-ml"
    (ssh,) = [r for r in report["resources"] if r["name"] == "firewall-ssh"]
    assert ssh["inputs"]["sources"] == ["203.0.113.0/24"]
    assert report["hourly_usd"] == round(choice.hourly * 2, 6)
    assert report["estimated"] is choice.estimated
    assert report["catalog"]["as_of"] == offers.current_catalog("gcp").as_of
    assert stack_files() == before


def test_offline_plan_is_sealed_readable_and_never_applied(
    no_account: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(no_account)
    before = stack_files()
    assert main(["plan", "--provider", "aws", "--nodes", "2", "--ssh-cidr", "198.51.100.7/32",
                 "--tag", "team=ml", "--out", "plan.json"]) == 0
    out = capsys.readouterr().out
    document = json.loads((no_account / "plan.json").read_text())
    assert OFFLINE in out and "cannot be applied" in out and document["digest"] in out
    assert document["offline"].startswith(OFFLINE)
    assert document["facts"]["nodes"] == 2 and document["facts"]["tags"] == {"team": "ml"}
    assert [n for n, r in document["resources"].items() if r["type"] == AWS_NODE] == \
        ["node-0", "node-1"]
    assert "PRIVATE KEY" not in json.dumps(document)
    assert main(["apply", "plan.json", "--approved", document["digest"]]) == 1
    err = capsys.readouterr().err
    assert "offline plan" in err and "Nothing was created" in err
    assert stack_files() == before


@pytest.mark.parametrize(("argv", "message"), [
    (["--accelerator", "A10G", "--disk-gb", "20"], "disk_gb=20 is smaller"),
    (["--ssh-cidr", "everyone"], "ssh_cidr must be a CIDR"),
    (["--region", "mars-1"], "mars-1"),
])
def test_bad_input_is_a_config_error_before_anything_runs(
    no_account: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    argv: list[str], message: str,
) -> None:
    from skyward_iac.infra.programs import offline

    ran: list[Any] = []  # the program's run under mocks: never reached
    monkeypatch.setattr(offline, "run_program", lambda *a: ran.append(a))
    assert main(["preview", "--provider", "aws", *argv]) == 1
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == "" and ran == []


def test_python_preview_offline_and_local_refusal(no_account: Path) -> None:
    result = preview(provider=sky.AWS(ssh_cidr="198.51.100.7/32"), nodes=1, hours=3)
    assert isinstance(result, OfflinePreview)
    assert [n.name for n in result.declared.nodes] == ["node-0"]
    assert result.estimate == pytest.approx(result.choice.hourly * 3)
    with pytest.raises(sky.ConfigError, match="runs for real"):
        preview(provider=sky.Local(), offline=True)


def test_forced_offline_and_what_a_real_preview_needs(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert offline_reason("local") is None
    assert "--offline" in (offline_reason("aws", forced=True) or "")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    reason = offline_reason("aws")
    assert reason is not None and "pulumi-resource-aws" in reason  # credentials alone: no


def test_key_inputs_hide_secrets_and_read_markets() -> None:
    wrapped = {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270",
               "value": "hunter2"}
    shown = key_inputs("pulumi:providers:gcp", {"project": wrapped, "region": "r"})
    assert shown == {"project": SECRET, "region": "r"}
    assert key_inputs(AWS_NODE, {"instanceType": "t3.small"})["market"] == "on-demand"
    assert key_inputs(GCP_NODE, {"scheduling": {"provisioningModel": "SPOT"}})["market"] == "spot"
    assert key_inputs("aws:ec2/keyPair:KeyPair", {"publicKey": "ssh-ed25519 AAAA"}) == {}


def test_a_look_up_the_offline_run_cannot_answer_is_named() -> None:
    with pytest.raises(RuntimeError, match="aws:ec2/getAvailabilityZones"):
        looked_up("aws:ec2/getAvailabilityZones:getAvailabilityZones", {}, "us-east-1")
