"""``sky.containers`` and a provider's ``container_image``: pinned image tags, the bootstrap's
host and in-container halves (parsed by bash, and the host half run for real where Docker is
absent), the cloud programs' disk, and Local's refusal without a Docker engine.

No Docker engine runs on this machine kind, so a container is never started here; what runs in
one is the same ``node_steps`` a bare node runs (tests/integration prove those)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

import skyward_iac as sky
from skyward_iac.infra.stacks import config as stack_config
from skyward_iac.orchestration.node import plan_for
from skyward_iac.outputs import NodeAddress
from skyward_iac.processes import remove_containers
from skyward_iac.remote import bootstrap
from skyward_iac.remote import container as docker
from skyward_iac.remote.volumes import MountPlan
from tests.unit import test_aws_program as aws_tests
from tests.unit import test_gcp_program as gcp_tests

ADDRESS = NodeAddress(index=0, private_address="10.0.0.5", public_address="203.0.113.5",
                      ssh_port=22, ssh_user="skyward", host_key="ssh-ed25519 AAAA",
                      workdir="/opt/skyward")


# -- sky.containers ---------------------------------------------------------------------------

@pytest.mark.parametrize(("image", "tag", "cuda"), [
    (lambda: sky.containers.cuda("12.9", variant="devel"), "nvidia/cuda:12.9.1-devel-ubuntu24.04",
     "12.9"),
    (lambda: sky.containers.cuda("12.8.0", ubuntu="22.04"),
     "nvidia/cuda:12.8.0-runtime-ubuntu22.04", "12.8"),
    (lambda: sky.containers.ubuntu("22.04"), "ubuntu:22.04", None),
    (lambda: sky.containers.pytorch("2.8"), "nvcr.io/nvidia/pytorch:25.04-py3", "12.9"),
    (lambda: sky.containers.runpod_pytorch("2.7"),
     "runpod/pytorch:2.7.0-py3.13-cuda12.8.1-devel-ubuntu24.04", "12.8"),
    (lambda: sky.containers.DockerImage.of("ghcr.io/acme/train:1.4", cuda="12.4"),
     "ghcr.io/acme/train:1.4", "12.4"),
])
def test_factories_pin_a_tag(image, tag: str, cuda: str | None) -> None:
    made = image()
    assert isinstance(made, sky.DockerImage)
    assert (str(made), made.cuda) == (tag, cuda)


@pytest.mark.parametrize(("call", "needle"), [
    (lambda: sky.containers.cuda("11.1"), "unknown CUDA version '11.1'"),
    (lambda: sky.containers.cuda("12.4", ubuntu="24.04"), "Ubuntu 22.04, 20.04"),
    (lambda: sky.containers.cuda("12.8", variant="slim"), "variant must be one of"),
    (lambda: sky.containers.pytorch("1.13"), "DockerImage.of"),
    (lambda: sky.containers.ubuntu("18.10"), "Ubuntu release"),
    (lambda: sky.DockerImage("Not An Image!"), "not a Docker image reference"),
    (lambda: sky.AWS(container_image=42), "container_image"),
])
def test_unknown_versions_and_bad_references_are_config_errors(call, needle: str) -> None:
    with pytest.raises(sky.ConfigError, match="(?s).*" + needle.replace("(", r"\(")):
        call()


def test_providers_take_a_reference_string_or_an_image() -> None:
    assert sky.GCP(container_image="ubuntu:24.04").container_image.tag == "ubuntu:24.04"
    assert sky.AWS().container_image is None


# -- the node's bootstrap ----------------------------------------------------------------------

def container_plan(accelerator=None, volumes=(), provider=None) -> bootstrap.BootstrapPlan:
    provider = provider or sky.AWS(container_image=sky.containers.cuda("12.8"), ssh_cidr="1.2.3.4/32")
    spec = sky.Spec(provider=provider, accelerator=accelerator, volumes=volumes)
    return plan_for(ADDRESS, spec, sky.Options())


def test_the_plan_names_the_image_devices_and_binds() -> None:
    nvidia = container_plan(sky.accelerators.A100(),
                            [sky.Volume(bucket="data", mount="/data")]).container
    assert nvidia is not None
    assert (nvidia.image, nvidia.devices, nvidia.binds, nvidia.install) == (
        "nvidia/cuda:12.8.1-runtime-ubuntu24.04", "nvidia", ("/data",), True)
    assert container_plan(sky.accelerators.Trainium()).container.devices == "neuron"
    assert container_plan(sky.accelerators.MI300X()).container.devices == "amd"
    assert container_plan().container.devices is None
    # The node's own uv and interpreter are not inside the image: both come to the workdir.
    assert container_plan().uv is None and container_plan().python != "auto"
    assert plan_for(ADDRESS, sky.Spec(provider=sky.AWS(ssh_cidr="1.2.3.4/32")),
                    sky.Options()).container is None


def test_host_half_starts_the_container_and_the_rest_runs_inside() -> None:
    plan = container_plan(sky.accelerators.A100(), [sky.Volume(bucket="data", mount="/data")])
    plan = dataclasses.replace(plan, volumes=MountPlan(mount=("mount-the-bucket /data",)))
    host = [name for name, _ in bootstrap.host_steps(plan)]
    inside = [name for name, _ in bootstrap.node_steps(plan)]
    assert host == ["cloud-init", "docker", "container image", "volumes", "container"]
    assert inside[0] == "python environment" and inside[-1] == "agent"
    assert "volumes" not in inside  # mounted on the host, bound in
    script, node_script = bootstrap.script(plan), bootstrap.node_script(plan)
    run_line = next(line for line in script.splitlines() if "docker run" in line)
    for flag in ("--network host", "--ipc host", "--gpus all", '-v "$W:$W"', "--init",
                 "dst=/data,bind-propagation=rslave", "nvidia/cuda:12.8.1-runtime-ubuntu24.04"):
        assert flag in run_line
    assert "nvidia-container-toolkit" in script and "nvidia-ctk runtime configure" in script
    assert script.rstrip().endswith('docker exec -i skyward-opt-skyward bash '
                                    '"$W/bootstrap-node.sh" || exit $?')
    assert "skyward_iac.node agent" in node_script and "skyward_iac.node agent" not in script
    # Every step name is announced once, in order, across the two halves (StepWatcher's list).
    announced = [line.split(" ", 1)[1].strip("'") for text in (script, node_script)
                 for line in text.splitlines() if line.startswith("step ")]
    assert announced == host + inside == [name for name, _ in bootstrap.steps(plan)]
    for text in (script, node_script):
        parsed = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
        assert parsed.returncode == 0, parsed.stderr


def test_cpu_node_gets_no_devices_and_no_toolkit() -> None:
    script = bootstrap.script(container_plan())
    assert "--gpus" not in script and "nvidia-ctk" not in script
    assert "apt-get -y -q -o DPkg::Lock::Timeout=300 install docker.io" in script


def test_without_a_container_image_the_script_is_one_half() -> None:
    plan = plan_for(ADDRESS, sky.Spec(provider=sky.AWS(ssh_cidr="1.2.3.4/32")), sky.Options())
    assert "docker" not in bootstrap.script(plan)
    assert [n for n, _ in bootstrap.host_steps(plan)] == ["cloud-init"]


def test_fencing_a_container_node_runs_inside_it() -> None:
    command = docker.inside(container_plan().container, "kill -0 1")
    assert "docker exec -i skyward-opt-skyward sh -c 'kill -0 1'" in command


def test_host_half_without_docker_says_so(tmp_path: Path) -> None:
    """The host half, run by bash on a machine without docker (PATH holds only bash and
    coreutils): it stops at step "docker" with a sentence, not a bare exit code."""
    spec = sky.Spec(provider=sky.Local(), accelerator=None)
    plan = plan_for(NodeAddress(index=0, private_address="127.0.0.1", public_address="127.0.0.1",
                                ssh_port=22, ssh_user="u", host_key="k", workdir=str(tmp_path)),
                    spec, sky.Options())
    plan = dataclasses.replace(plan, container=docker.ContainerPlan(
        image="ubuntu:24.04", name="n", install=False))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("mkdir", "chmod", "sed", "tee", "touch", "cat"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    result = subprocess.run([shutil.which("bash"), "-c", bootstrap.script(plan)],
                            env={"PATH": str(bin_dir)}, capture_output=True, text=True,
                            timeout=30, cwd=tmp_path)
    assert result.returncode != 0
    assert "::step docker" in result.stdout
    assert "::error container_image needs Docker on this machine" in result.stdout


# -- programs, stack config and Local ----------------------------------------------------------

def test_cloud_programs_give_a_container_node_room_for_its_image() -> None:
    image = sky.containers.pytorch("2.8")
    mocks, _ = aws_tests.run(aws_tests.aws_spec(None).model_copy(update={
        "provider": sky.AWS(ssh_cidr=aws_tests.CALLER, container_image=image)}))
    assert mocks.of_type(aws_tests.INSTANCE)[0].inputs["rootBlockDevice"]["volumeSize"] == 60
    mocks, _ = gcp_tests.run(gcp_tests.gcp_spec(None).model_copy(update={
        "provider": sky.GCP(ssh_cidr=gcp_tests.CALLER, project="p", container_image=image)}))
    boot = mocks.of_type(gcp_tests.INSTANCE)[0].inputs["bootDisk"]["initializeParams"]
    assert boot["size"] == 60
    # A CPU pool without an image keeps the small disk.
    mocks, _ = aws_tests.run(aws_tests.aws_spec(None))
    assert mocks.of_type(aws_tests.INSTANCE)[0].inputs["rootBlockDevice"]["volumeSize"] == 30


def test_stack_config_carries_the_image() -> None:
    spec = stack_config.spec_from_settings("gcp", {"containerImage": "ubuntu:24.04",
                                                   "project": "p"})
    assert spec.provider.container_image.tag == "ubuntu:24.04"


def test_local_refuses_an_image_without_a_docker_engine(tmp_path: Path) -> None:
    if docker.local_engine_problem("ubuntu:24.04") is None:
        pytest.skip("a Docker engine with ubuntu:24.04 answers here; the refusal cannot happen")
    before = set(Path(os.environ.get("SKYWARD_HOME", tmp_path)).glob("**/*.json"))
    with pytest.raises(sky.ConfigError, match="Local runs containers only with a Docker engine"):
        with sky.Compute(provider=sky.Local(container_image="ubuntu:24.04")):
            pass
    assert set(Path(os.environ.get("SKYWARD_HOME", tmp_path)).glob("**/*.json")) == before


def test_local_container_and_volumes_do_not_mix() -> None:
    with pytest.raises(sky.ConfigError, match="container_image or volumes on Local"):
        sky.Spec(provider=sky.Local(container_image="ubuntu:24.04"),
                 volumes=[sky.Volume(bucket="my-data", mount="/data", storage=sky.Storage(
                     endpoint="http://127.0.0.1:9000", access_key="a", secret_key="b"))])


def test_removing_a_sandbox_removes_its_containers(tmp_path: Path, monkeypatch) -> None:
    """``stop_sandbox`` removes the containers labelled with a workdir inside the sandbox and
    no other (a recording stand-in for the docker CLI: no engine runs here)."""
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text(f"""#!/bin/sh
echo "$@" >> {calls}
[ "$1" = ps ] && printf 'aaa {tmp_path}/sandbox/node-0/home\\nbbb /elsewhere/node-0\\nccc {tmp_path}/sandbox-other/x\\n'
exit 0
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    assert remove_containers(tmp_path / "sandbox") == ["aaa"]
    assert calls.read_text().splitlines()[-1] == "rm -f aaa"
