"""stacks/local as ops run it: `pulumi preview`, `up` and `destroy` through our language host.

The project is copied to a temporary directory (``stack init`` writes a salt into the stack
file) and run with the repo's tools/pulumi launchers first on PATH, so these tests exercise
the checked-in ``pulumi-language-python`` whether or not it was installed next to the engine.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import empty_pb2
from pulumi.runtime.proto import language_pb2, language_pb2_grpc

from skyward_iac.infra.engine import locate as engine
from skyward_iac.infra.engine.language_host import parse_args, serve
from tests.helpers import stack_processes, stack_sandboxes

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
LAUNCHERS = REPO / "tools" / "pulumi"
STACK = "dev"
SKYWARD_STACK = f"skyward-local-{STACK}"  # what __main__.py names the cluster's resources


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    """The engine's environment (temporary backend, passphrase) with our launchers on PATH."""
    found = engine.find_engine()
    base = engine.engine_env(found)
    return {**os.environ, **base, "PATH": os.pathsep.join([str(LAUNCHERS), base["PATH"]])}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> Iterator[Path]:
    """stacks/local with a ``dev`` stack made from Pulumi.example.yaml (2 nodes)."""
    directory = tmp_path_factory.mktemp("stacks") / "local"
    shutil.copytree(REPO / "stacks" / "local", directory)
    shutil.copy(directory / "Pulumi.example.yaml", directory / f"Pulumi.{STACK}.yaml")
    pulumi_cli(directory, env, "stack", "init", STACK)
    yield directory
    # Whatever a failed test left: destroy it, then drop the stack.
    pulumi_cli(directory, env, "destroy", "--yes", "--skip-preview", check=False)
    pulumi_cli(directory, env, "stack", "rm", "--yes", "--force", check=False)


def pulumi_cli(cwd: Path, env: dict[str, str], *args: str,
               check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the engine like an ops engineer would, in the project directory."""
    binary = str(engine.find_engine().binary)
    done = subprocess.run([binary, *args, "--non-interactive"], cwd=cwd, env=env, check=False,
                          capture_output=True, text=True, timeout=180)
    if check:
        assert done.returncode == 0, f"pulumi {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


def test_preview_lists_credentials_and_one_local_node_per_node(
    project: Path, env: dict[str, str],
) -> None:
    done = pulumi_cli(project, env, "preview", "--json")
    steps = json.loads(done.stdout)["steps"]
    types = [step["newState"]["type"] for step in steps if step["op"] == "create"]
    assert types.count("pulumi-python:dynamic/skyward:StackCredentials") == 1
    assert types.count("pulumi-python:dynamic/skyward:LocalNode") == 2
    assert {step["op"] for step in steps} == {"create"}
    assert stack_sandboxes(SKYWARD_STACK) == [], "a preview must not create nodes"
    # The human diff ops read names the same resources.
    text = pulumi_cli(project, env, "preview", "--diff").stdout
    assert "+ pulumi-python:dynamic/skyward:LocalNode: (create)" in text


def test_up_starts_real_nodes_and_destroy_removes_them(
    project: Path, env: dict[str, str],
) -> None:
    pulumi_cli(project, env, "up", "--yes", "--skip-preview")
    try:
        outputs = json.loads(pulumi_cli(project, env, "stack", "output", "--json").stdout)
        nodes = outputs["nodes"]
        assert [n["index"] for n in nodes] == [0, 1]
        assert outputs["ssh_private_key"] == "[secret]"  # secrets stay secret without a flag
        for node in nodes:
            with socket.create_connection((node["private_address"], node["ssh_port"]),
                                          timeout=5) as conn:
                assert conn.recv(64).startswith(b"SSH-2.0-"), "expected the node's sshd"
        assert len(stack_sandboxes(SKYWARD_STACK)) == 2
        assert stack_processes(SKYWARD_STACK), "expected the nodes' sshd processes"
    finally:
        pulumi_cli(project, env, "destroy", "--yes", "--skip-preview")
    assert stack_processes(SKYWARD_STACK) == [], "an sshd of the stack outlived destroy"
    assert stack_sandboxes(SKYWARD_STACK) == [], "a sandbox of the stack outlived destroy"
    history = json.loads(pulumi_cli(project, env, "stack", "history", "--json").stdout)
    assert [(u["kind"], u["result"]) for u in history[:2]] == [("destroy", "succeeded"),
                                                              ("update", "succeeded")]


def test_a_bad_config_key_fails_the_preview_with_the_reason(
    project: Path, env: dict[str, str],
) -> None:
    pulumi_cli(project, env, "config", "set", "skyward:node", "3")
    try:
        done = pulumi_cli(project, env, "preview", check=False)
    finally:
        pulumi_cli(project, env, "config", "rm", "skyward:node")
    assert done.returncode != 0
    assert "ConfigError: unknown local setting(s) node; known: nodes" in done.stdout
    assert "Traceback" not in done.stdout  # the message says what to do; no stack trace


# -- the language host's gRPC service, without the engine --------------------------------------


@pytest.fixture(scope="module")
def host() -> Iterator[language_pb2_grpc.LanguageRuntimeStub]:
    server, port = serve(engine_address="")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield language_pb2_grpc.LanguageRuntimeStub(channel)
    channel.close()
    server.stop(0)


def test_host_answers_the_engines_setup_calls(
    host: language_pb2_grpc.LanguageRuntimeStub,
) -> None:
    info = language_pb2.ProgramInfo(root_directory=str(REPO / "stacks" / "local"),
                                    program_directory=str(REPO / "stacks" / "local"),
                                    entry_point=".")
    assert host.GetPluginInfo(empty_pb2.Empty()).version == engine.sdk_version()
    required = host.GetRequiredPackages(language_pb2.GetRequiredPackagesRequest(info=info))
    assert list(required.packages) == []  # providers load on demand: no aws plugin for local
    about = host.About(language_pb2.AboutRequest(info=info))
    assert about.executable == sys.executable
    dependencies = host.GetProgramDependencies(
        language_pb2.GetProgramDependenciesRequest(info=info)).dependencies
    assert {"pulumi", "skyward_iac"} <= {d.name for d in dependencies}
    installed = list(host.InstallDependencies(language_pb2.InstallDependenciesRequest(info=info)))
    assert b"nothing to install" in installed[0].stdout
    host.Handshake(language_pb2.LanguageHandshakeRequest(engine_address="127.0.0.1:1"))
    with pytest.raises(grpc.RpcError) as caught:
        host.GenerateProject(language_pb2.GenerateProjectRequest())
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_launcher_prints_its_port_first() -> None:
    process = subprocess.Popen(
        [str(LAUNCHERS / "pulumi-language-python"), "-v=3", "127.0.0.1:1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env={**os.environ, "PULUMI_PYTHON_CMD": sys.executable},
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        process.kill()
        process.wait(timeout=10)


def test_engine_arguments_are_parsed_like_pulumis_host() -> None:
    args = parse_args(["--tracing", "http://t", "--logtostderr", "-v=9", "-root=/x",
                       "127.0.0.1:4242"])
    assert (args.engine_address, args.verbose, args.logtostderr) == ("127.0.0.1:4242", 9, True)
