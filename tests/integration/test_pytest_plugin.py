"""skyward_iac.testing, used the way a user uses it: `pytest -p skyward_iac.testing` run on
examples/user_tests in a separate process, with real pools; and the skip when set-up is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.options import Options
from skyward_iac.api.spec import Image
from skyward_iac.infra.stacks.stack import ClusterStack, list_records
from skyward_iac.testing import pool_settings
from tests.helpers import stack_processes, stack_sandboxes

ROOT = Path(__file__).resolve().parents[2]
USER_TESTS = ROOT / "examples" / "user_tests"


def users_pytest(project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m pytest -p skyward_iac.testing`` in the user's project directory."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "skyward_iac.testing", "-rs", "-v"],
        cwd=project, env=env, capture_output=True, text=True, timeout=600, check=False,
        stdin=subprocess.DEVNULL,
    )


def project_copy(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    shutil.copytree(USER_TESTS, project, ignore=shutil.ignore_patterns("__pycache__"))
    return project


@pytest.mark.integration
def test_a_users_tests_get_real_pools_that_are_gone_afterwards(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "skyward-home"
    env = {**os.environ, "SKYWARD_HOME": str(home), "PYTHONPATH": str(ROOT)}
    done = users_pytest(project_copy(tmp_path), env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout

    monkeypatch.setenv("SKYWARD_HOME", str(home))  # look at what that run left in its home
    stacks = {record.name: record for record in list_records()}
    # One pool per configuration (the ini's 2 nodes, the marker's 1), each destroyed.
    assert sorted(record.tags["nodes"] for record in stacks.values()) == ["1", "2"]
    for name in stacks:
        assert ClusterStack.select(name).resource_count() == 0
        assert stack_processes(name) == [] and stack_sandboxes(name) == []


def test_without_set_up_the_pool_tests_are_skipped_saying_why(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SKYWARD_PULUMI_ROOT": str(tmp_path / "none"),
           "SKYWARD_HOME": str(tmp_path / "skyward-home"), "HOME": str(tmp_path / "home"),
           "PATH": os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                   if not (Path(p) / "pulumi").exists())}
    done = users_pytest(project_copy(tmp_path), env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "3 skipped" in done.stdout
    assert "sky_pool needs the Pulumi engine; run scripts/setup" in done.stdout
    assert "no Pulumi engine >= " in done.stdout
    assert not (tmp_path / "skyward-home" / "state").exists()  # nothing was attempted


def test_the_marker_wins_over_the_ini_file() -> None:
    ini = {"sky_pool_nodes": "3", "sky_pool_pip": ["numpy"], "sky_pool_console": "log"}
    assert pool_settings({}, ini) == {
        "nodes": 3, "image": Image(pip=("numpy",)), "options": Options(console="log")}
    image = Image(pip=("pandas",))
    chosen = pool_settings({"nodes": 1, "image": image}, ini)
    assert chosen["nodes"] == 1 and chosen["image"] == image
    assert pool_settings({}, {})["options"] == Options(console="minimal")
    assert "image" not in pool_settings({}, {"sky_pool_pip": []})


@pytest.mark.parametrize(("marked", "ini", "message"), [
    ({"node": 2}, {}, "takes nodes, image, options; got ['node']"),
    ({}, {"sky_pool_nodes": "two"}, "sky_pool_nodes must be a whole number, got 'two'"),
    ({}, {"sky_pool_console": "loud"}, "Input should be 'rich', 'log', 'minimal' or 'silent'"),
])
def test_bad_settings_are_a_config_error_before_anything_is_provisioned(
        marked: dict[str, object], ini: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        pool_settings(marked, ini)
    assert message in str(raised.value)
