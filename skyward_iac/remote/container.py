"""Running a node's agent inside a container image (a provider's ``container_image=``).

The bootstrap then has two halves. On the node itself: Docker (and, on NVIDIA nodes, the
NVIDIA container toolkit) installed when missing, the image pulled, and one long-lived
container started with the host's network and IPC, the node's accelerators, the workdir and
the bucket volumes bind-mounted at the same paths. Inside that container (``docker exec``):
everything else, from the Python environment to the agent, exactly as on a bare node. The
host network keeps the agent's port, etcd and the SSH tunnels where they are without a container;
the workdir bind keeps the heartbeat, logs and pid files where the host's tools look.

Pure functions build the shell lines; ``local_engine_problem`` is the one probe (Local pools).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

from skyward_iac.processes import CONTAINER_LABEL

#: How a node's accelerators reach the container, by vendor (``api.accelerators.Vendor``).
Devices = Literal["nvidia", "amd", "neuron"]
DEVICE_FLAGS: dict[str, str] = {
    "nvidia": "--gpus all",
    "amd": "--device /dev/kfd --device /dev/dri --group-add video",
    # Trainium/Inferentia: every /dev/neuronN the node has.
    "neuron": '$(for d in /dev/neuron*; do printf -- "--device %s " "$d"; done)',
}
#: NVIDIA's documented apt source for the container toolkit.
NVIDIA_TOOLKIT_KEY = "https://nvidia.github.io/libnvidia-container/gpgkey"
NVIDIA_TOOLKIT_LIST = ("https://nvidia.github.io/libnvidia-container/stable/deb/"
                       "nvidia-container-toolkit.list")
NVIDIA_KEYRING = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"


@dataclass(frozen=True, slots=True)
class ContainerPlan:
    """One node's container: the image, its name, the accelerators it gets, extra binds."""

    image: str
    name: str
    devices: Devices | None = None
    #: Host paths bind-mounted at the same path (the bucket volumes), mounts propagating in.
    binds: tuple[str, ...] = ()
    #: Clouds install Docker and pull the image when missing; Local uses what is there.
    install: bool = True


def devices_for(vendor: str | None) -> Devices | None:
    """The container's accelerator access for an accelerator vendor; None for CPU nodes."""
    return {"nvidia": "nvidia", "amd": "amd", "aws": "neuron"}.get(vendor or "")  # type: ignore[return-value]


def container_name(workdir: str) -> str:
    """A container name unique per node workdir (Local nodes share one Docker engine)."""
    tail = workdir.strip("/").replace("/", "-") or "root"
    return "skyward-" + "".join(c if c.isalnum() or c in "_.-" else "-" for c in tail)[-100:]


def exec_prefix(plan: ContainerPlan) -> str:
    """What runs a command inside the node's container (``$SUDO`` set by ``engine_lines``)."""
    return f"$SUDO docker exec -i {shlex.quote(plan.name)}"


def inside(plan: ContainerPlan, command: str) -> str:
    """A host shell command that runs ``command`` (sh syntax) inside the node's container."""
    return (f'SUDO=; [ "$(id -u)" = 0 ] || SUDO="sudo -n"; {exec_prefix(plan)} sh -c '
            f"{shlex.quote(command)}")


def engine_lines(plan: ContainerPlan) -> list[str]:
    """Step "docker": an answering Docker engine (installed on clouds when missing), and the
    NVIDIA runtime on NVIDIA nodes."""
    apt = "$SUDO env DEBIAN_FRONTEND=noninteractive apt-get -y -q -o DPkg::Lock::Timeout=300"
    missing = ('die "container_image needs Docker on this machine: install it, or drop '
               'container_image"') if not plan.install else (
        f'{{ command -v apt-get >/dev/null || die "container_image needs Docker, and this node '
        f'has no apt-get to install it with"; {apt} update && {apt} install docker.io; }}')
    lines = [
        'SUDO=; [ "$(id -u)" = 0 ] || SUDO="sudo -n"',
        f"command -v docker >/dev/null || {missing}",
        "$SUDO docker info >/dev/null 2>&1 || $SUDO systemctl start docker 2>/dev/null || true",
        '$SUDO docker info >/dev/null 2>&1 || die "the Docker engine does not answer '
        '(docker info failed)"',
    ]
    if plan.devices == "nvidia":
        toolkit = (
            f"curl -fsSL {NVIDIA_TOOLKIT_KEY} | $SUDO gpg --batch --yes --dearmor -o "
            f"{NVIDIA_KEYRING} && curl -fsSL {NVIDIA_TOOLKIT_LIST} | sed "
            f"'s#deb https://#deb [signed-by={NVIDIA_KEYRING}] https://#' | $SUDO tee "
            "/etc/apt/sources.list.d/nvidia-container-toolkit.list >/dev/null && "
            f"{apt} update && {apt} install nvidia-container-toolkit"
        ) if plan.install else 'die "GPU containers need the NVIDIA container toolkit"'
        lines += [
            "if ! $SUDO docker info --format '{{json .Runtimes}}' | grep -q nvidia; then",
            f"  command -v nvidia-ctk >/dev/null || {{ {toolkit}; }}",
            "  $SUDO nvidia-ctk runtime configure --runtime=docker >/dev/null",
            "  $SUDO systemctl restart docker",
            "fi",
        ]
    return lines


def image_lines(plan: ContainerPlan) -> list[str]:
    """Step "container image": the image present on the node (pulled on clouds)."""
    image = shlex.quote(plan.image)
    absent = (f"$SUDO docker pull --quiet {image}" if plan.install else
              f'die "the image {plan.image} is not on this machine (docker pull it first)"')
    return [f"$SUDO docker image inspect {image} >/dev/null 2>&1 || {absent}"]


def run_lines(plan: ContainerPlan) -> list[str]:
    """Step "container": the node's long-lived container, replacing any earlier one."""
    q = shlex.quote
    binds = "".join(f" --mount type=bind,src={q(path)},dst={q(path)},bind-propagation=rslave"
                    for path in plan.binds)
    devices = f" {DEVICE_FLAGS[plan.devices]}" if plan.devices else ""
    return [
        f"$SUDO docker rm -f {q(plan.name)} >/dev/null 2>&1 || true",
        # --init reaps the agent's orphans; sleep keeps the container up between execs.
        f'$SUDO docker run -d --name {q(plan.name)} --label {CONTAINER_LABEL}="$W" --init '
        "--network host --ipc host --ulimit memlock=-1 --shm-size 1g"
        f'{devices} -v "$W:$W"{binds} -e HOME="$W" -w "$W" --entrypoint sleep '
        f"{q(plan.image)} infinity >/dev/null",
    ]


def enter_line(plan: ContainerPlan, script: str) -> str:
    """Run the in-container half; ``|| exit`` keeps the host's ERR trap from reporting the
    ``docker exec`` on top of the failure the inner script already named."""
    return f'{exec_prefix(plan)} bash "$W/{script}" || exit $?'


def local_engine_problem(image: str) -> str | None:
    """Why a Local pool cannot run ``image`` here (no Docker, no engine, no image); None if it
    can."""
    if shutil.which("docker") is None:
        return "Docker is not installed on this machine"
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                          capture_output=True, text=True, timeout=20, check=False)
    if info.returncode != 0:
        return "no Docker engine answers on this machine (docker info failed: " \
               f"{(info.stderr.strip().splitlines() or ['?'])[-1]})"
    present = subprocess.run(["docker", "image", "inspect", image], capture_output=True,
                             timeout=20, check=False)
    if present.returncode != 0:
        return f"the image {image} is not on this machine (docker pull it first)"
    return None
