"""The bootstrap script generated from a BootstrapPlan: its steps, its shell, its routing."""

from __future__ import annotations

import importlib.metadata
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.orchestration.node import plan_for
from skyward_iac.outputs import EtcdMaterial, NodeAddress
from skyward_iac.remote.bootstrap import (
    BootstrapPlan,
    requirement_name,
    route_packages,
    script,
    steps,
)
from skyward_iac.remote.bootstrap_progress import StepUpdate, StepWatcher
from skyward_iac.remote.bootstrap_run import can_ship_uv
from skyward_iac.remote.includes import IncludesArchive

ADDRESS = NodeAddress(index=0, private_address="10.0.0.5", public_address="203.0.113.5",
                      ssh_port=22, ssh_user="ubuntu", host_key="ssh-ed25519 AAAA",
                      workdir="/opt/skyward/work")


def full_plan(**fields: object) -> BootstrapPlan:
    base: dict = dict(
        node=0, workdir="/opt/skyward/work", python="3.11", pip=("six", "torch==2.5.1"),
        pip_indexes=(("https://download.pytorch.org/whl/cpu", ("torch", "torchvision")),),
        apt=("jq", "tree=2.1.0-1"), env={"GREETING": "hi there"},
        shell_vars={"HOST": "hostname"}, includes=IncludesArchive(b"", (".", "src")),
        metrics=(sky.metrics.CPU(interval=0.5),), cloud_init=True,
    )
    return BootstrapPlan(**{**base, **fields})


def step_body(plan: BootstrapPlan, name: str) -> str:
    return "\n".join(dict(steps(plan))[name])


def test_steps_follow_the_image_in_order() -> None:
    names = [name for name, _ in steps(full_plan(steps=(("plugin: hello", "echo hi"),)))]
    assert names == ["cloud-init", "apt packages", "python environment", "node packages",
                     "skyward", "packages from download.pytorch.org/whl/cpu", "image packages",
                     "includes", "plugin: hello", "shell vars", "agent"]
    minimal = BootstrapPlan(node=1, workdir="/w", python="3.11")
    assert [n for n, _ in steps(minimal)] == ["python environment", "node packages", "skyward",
                                              "agent"]


def test_the_script_is_valid_bash_and_every_step_is_announced() -> None:
    plan = full_plan()
    text = script(plan)
    checked = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    for name, _ in steps(plan):
        assert f"\nstep {shlex.quote(name)}\n" in text
    # The Image's env is exported before the first step, so the installs see it too.
    assert text.index("export GREETING='hi there'") < text.index("step cloud-init")


def test_packages_are_routed_to_their_index() -> None:
    default, per_index = route_packages(
        ["six", "Torch==2.5.1", "numpy"], [("https://idx", ("torch", "torch_vision"))])
    assert default == ("six", "numpy")
    assert per_index == (("https://idx", ("Torch==2.5.1", "torch_vision")),)
    assert requirement_name("Torch_Vision[extra]>=1") == "torch-vision"
    plan = full_plan()
    assert step_body(plan, "packages from download.pytorch.org/whl/cpu").endswith(
        "--index https://download.pytorch.org/whl/cpu torch==2.5.1 torchvision")
    assert step_body(plan, "image packages").endswith('"$W/venv/bin/python" six')


def test_apt_skips_installed_packages_and_uses_sudo_when_not_root() -> None:
    body = step_body(full_plan(), "apt packages")
    assert "for p in jq tree=2.1.0-1; do" in body
    assert "dpkg-query -W" in body and "ok installed" in body
    assert 'SUDO="sudo -n"' in body and '[ "$(id -u)" = 0 ]' in body
    assert "DEBIAN_FRONTEND=noninteractive apt-get" in body
    assert "$APT update" in body  # only when a plain install cannot find the packages


def test_cloud_nodes_wait_for_cloud_init_and_find_a_uv() -> None:
    assert "cloud-init status --wait" in step_body(full_plan(), "cloud-init")
    assert "cloud-init" not in [n for n, _ in steps(full_plan(cloud_init=False))]
    python = step_body(full_plan(), "python environment")
    uv = f"uv=={importlib.metadata.version('uv')}"
    # No uv on the node and none shipped: a venv with the pinned uv, never a bare --user
    # install (PEP 668 refuses it on Ubuntu 24.04) except as the last resort.
    assert f'python3 -m venv "$W/uv-venv" && "$W/uv-venv/bin/pip" install --quiet {uv}' in python
    assert f"--break-system-packages {uv}" in python
    shipped = step_body(full_plan(uv="/opt/skyward/work/bin/uv"), "python environment")
    assert shipped.startswith("UV=/opt/skyward/work/bin/uv")


def test_uv_is_shipped_only_to_a_linux_node_of_the_same_cpu() -> None:
    assert can_ship_uv("x86_64", "x86_64", "linux")
    assert can_ship_uv("aarch64", "arm64", "linux")
    assert not can_ship_uv("aarch64", "x86_64", "linux")
    assert not can_ship_uv("arm64", "arm64", "darwin")


def test_skyward_source_local_ships_the_package_and_pypi_installs_the_client_version() -> None:
    local = step_body(full_plan(), "skyward")
    assert "tar -xzf project.tgz" in local
    pypi = step_body(full_plan(skyward_source="pypi"), "skyward")
    pin = f"skyward_iac=={importlib.metadata.version('skyward_iac')}"
    assert f"--no-deps {pin} || die" in pypi and "published to PyPI" in pypi


def test_includes_shell_vars_and_metrics_reach_the_agent() -> None:
    plan = full_plan()
    includes = step_body(plan, "includes")
    assert 'printf "%s\\n" "$W/includes" "$W/includes"/src > "$SITE/skyward_includes.pth"' \
        in includes
    assert step_body(plan, "shell vars").splitlines() == ["HOST=$(hostname", ")", "export HOST"]
    agent = step_body(plan, "agent")
    assert """--metrics '[{"type":"CPU","interval":0.5}]'""" in agent
    assert "--metrics" not in step_body(full_plan(metrics=()), "agent")


def test_plan_for_reads_the_image_and_the_pool_timeout_wins(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    image = sky.Image(pip=["six"], apt=["jq"], shell_vars={"H": "hostname"},
                      includes=[str(tmp_path / "pkg")], metrics=None, bootstrap_timeout=42,
                      pip_indexes=[sky.PipIndex(url="https://idx/simple", packages=["torch"])])
    spec = sky.Spec(provider=sky.AWS(), image=image)
    plan = plan_for(ADDRESS, spec, sky.Options())
    assert plan.timeout == 42 and plan.metrics == () and plan.cloud_init
    assert plan.pip_indexes == (("https://idx/simple", ("torch",)),)
    assert plan.includes is not None and plan.includes.import_roots == (".",)
    assert plan.apt == ("jq",) and plan.shell_vars == {"H": "hostname"} and plan.uv is None
    assert plan_for(ADDRESS, spec, sky.Options(bootstrap_timeout=7)).timeout == 7
    local = plan_for(ADDRESS, sky.Spec(provider=sky.Local()), sky.Options())
    assert not local.cloud_init and local.uv and local.python == sys.executable
    assert local.metrics == sky.metrics.Default()


def run_steps(tmp_path: Path, plan: BootstrapPlan, names: list[str]
              ) -> tuple[int, StepWatcher, list[StepUpdate]]:
    """Run the script's preamble and the named steps with bash, its output into a watcher."""
    text = script(plan)
    preamble = text[:text.index("\nW=")]
    body = "\n".join(f"step {shlex.quote(n)}\n" + "\n".join(dict(steps(plan))[n]) for n in names)
    updates: list[StepUpdate] = []
    watcher = StepWatcher(plan.node, names, updates.append)
    process = subprocess.run(["bash", "-c", preamble + "\n" + body], capture_output=True,
                             text=True, cwd=tmp_path)
    watcher.write(process.stdout)
    return process.returncode, watcher, updates


def test_a_failing_shell_var_reports_its_command_exit_code_and_output(tmp_path: Path) -> None:
    plan = BootstrapPlan(node=3, workdir=str(tmp_path), python="3.11", shell_vars={
        "FINE": "echo ok", "BROKEN": "echo first >&2; echo second >&2; exit 7"})
    code, watcher, updates = run_steps(tmp_path, plan, ["shell vars"])
    assert code == 7
    failure = watcher.failure(code)
    assert [(u.name, u.status) for u in updates] == [("shell vars", "started"),
                                                     ("shell vars", "failed")]
    assert updates[-1].detail == failure.summary
    assert failure.step == "shell vars" and failure.exit_code == 7
    assert failure.command == "BROKEN=$(echo first 1>&2; echo second 1>&2; exit 7)"
    assert failure.tail == ("first", "second")
    message = failure.describe(3)
    assert message.startswith("bootstrap of node 3 failed at step 'shell vars' running `BROKEN")
    assert "(exit code 7)" in message and "  | second" in message


def test_a_check_that_dies_says_why(tmp_path: Path) -> None:
    plan = BootstrapPlan(node=0, workdir=str(tmp_path), python="3.11")
    text = script(plan)
    preamble = text[:text.index("\nW=")]
    process = subprocess.run(["bash", "-c", preamble + "\nstep agent\ndie 'the agent exited'"],
                             capture_output=True, text=True)
    watcher = StepWatcher(0, ["agent"])
    watcher.write(process.stdout)
    failure = watcher.failure(process.returncode)
    assert failure.summary == "the agent exited (exit code 1)"


@pytest.mark.parametrize("secret_url", ["https://user:s3cret@pkgs.example.com/simple"])
def test_index_credentials_never_reach_the_error(secret_url: str) -> None:
    watcher = StepWatcher(0, ["packages from pkgs.example.com"])
    watcher.write("::step packages from pkgs.example.com\n"
                  f"error: failed to fetch {secret_url}/torch/\n"
                  f"::failed 2 uv pip install --index {secret_url} torch\n")
    message = watcher.failure(2).describe(0)
    assert "s3cret" not in message and "https://***@pkgs.example.com" in message


def test_local_nodes_inherit_the_client_network_settings_and_image_env_wins(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("SSL_CERT_FILE", "/etc/ssl/corp.pem")
    monkeypatch.setenv("SOME_SECRET", "not-a-network-setting")
    image = sky.Image(env={"SSL_CERT_FILE": "/opt/mine.pem"})
    local = plan_for(ADDRESS, sky.Spec(provider=sky.Local(), image=image), sky.Options())
    assert local.env["HTTPS_PROXY"] == "http://proxy.internal:3128"
    assert local.env["SSL_CERT_FILE"] == "/opt/mine.pem" and "SOME_SECRET" not in local.env
    cloud = plan_for(ADDRESS, sky.Spec(provider=sky.AWS(), image=image), sky.Options())
    assert cloud.env == {"SSL_CERT_FILE": "/opt/mine.pem"}  # a cloud node has its own network


def test_the_node_keeps_a_redacted_copy_of_the_bootstrap_output(tmp_path: Path) -> None:
    plan = BootstrapPlan(node=0, workdir=str(tmp_path), python="3.11")
    text = script(plan)
    head = text[:text.index('\ntouch "$W/heartbeat"')]  # preamble, cd, log redirection
    process = subprocess.run(
        ["bash", "-c", head + "\necho 'from https://me:s3cret@idx.example/simple'"
                              "\necho 'to stderr' >&2\nexit 3"],
        capture_output=True, text=True)
    assert process.returncode == 3
    kept = (tmp_path / "log" / "bootstrap.log").read_text()
    assert "https://***@idx.example/simple" in kept and "to stderr" in kept
    assert "s3cret" not in kept and "s3cret" not in process.stdout
    assert "https://***@idx.example/simple" in process.stdout  # the client still sees it


def test_each_provider_binds_its_agents_data_port_where_its_firewall_lets_the_client_in() -> None:
    from skyward_iac.node.data_port import CLOUD_BIND
    from skyward_iac.remote.bootstrap import EtcdServerPlan

    etcd = EtcdServerPlan("10.0.0.5", "CA", "CERT", "KEY")
    for provider in (sky.AWS(), sky.GCP(project="p")):
        plan = plan_for(ADDRESS, sky.Spec(provider=provider), sky.Options(), etcd)
        assert plan.data_port is not None and plan.data_port.bind == CLOUD_BIND
        assert f"--data-bind {CLOUD_BIND}" in step_body(plan, "agent")
    local = plan_for(ADDRESS, sky.Spec(provider=sky.Local()), sky.Options(), etcd)
    assert local.data_port is not None and local.data_port.bind == ADDRESS.private_address
    # A stack without etcd (cluster=False) still has its PKI: the data port presents it.
    pki = EtcdMaterial("CA2", "SCERT", "SKEY", "CCERT", "CKEY")
    alone = plan_for(ADDRESS, sky.Spec(provider=sky.AWS()), sky.Options(), None, pki=pki)
    assert alone.etcd is None and alone.data_port is not None
    assert (alone.data_port.ca_pem, alone.data_port.cert_pem) == ("CA2", "SCERT")
    # No PKI at all (a stack from before it was always made): the SSH tunnel.
    assert plan_for(ADDRESS, sky.Spec(provider=sky.AWS()), sky.Options()).data_port is None
    # In a container: the tunnel for now.
    boxed = sky.Spec(provider=sky.AWS(container_image="python:3.11-slim"))
    assert plan_for(ADDRESS, boxed, sky.Options(), etcd).data_port is None
