"""``sky.plugins.torch``: PyTorch on every node and ``torch.distributed`` ready to initialise."""

from __future__ import annotations

import functools
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal

from skyward_iac.api.plugin import Cluster, Plugin
from skyward_iac.api.runtime import InstanceInfo
from skyward_iac.plugins._support import (
    environment,
    refreshing_environment,
    rendezvous_port,
    requirement,
    with_packages,
)

if TYPE_CHECKING:
    from skyward_iac.api.spec import Image

#: Where PyTorch publishes its CUDA builds: ``{TORCH_INDEX}/cu128``.
TORCH_INDEX = "https://download.pytorch.org/whl"
Backend = Literal["nccl", "gloo", "mpi"]


def torch(*, backend: Backend | None = None, cuda: str = "cu128", version: str = "latest",
          vision: str | None = None, audio: str | None = None) -> Plugin:
    """Install PyTorch on the nodes and set the ``torch.distributed`` environment.

    On GPU clouds torch (and torchvision/torchaudio when ``vision``/``audio`` give a version
    or ``"latest"``) come from PyTorch's ``cuda`` index; elsewhere from PyPI. Every worker gets
    ``MASTER_ADDR`` (the head), ``MASTER_PORT`` (derived from the pool id), ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK`` and
    ``SKYWARD_TORCH_BACKEND`` (``backend``, else ``nccl`` on GPUs and ``gloo`` on CPUs), so a
    broadcast task calls ``dist.init_process_group(os.environ["SKYWARD_TORCH_BACKEND"])``.
    """
    if not cuda.startswith("cu") or not cuda[2:].isdigit():
        raise ValueError(f"torch(cuda=...) names a PyTorch CUDA build such as 'cu128', got {cuda!r}")
    packages = (requirement("torch", version),
                *((requirement("torchvision", vision),) if vision else ()),
                *((requirement("torchaudio", audio),) if audio else ()))
    return (
        Plugin.create("torch")
        .with_image_transform(functools.partial(_install, packages, backend, cuda))
        .with_around_process(torch_environment)
        .with_decorator(refreshing_environment(distributed_env))
    )


def _install(packages: tuple[str, ...], backend: Backend | None, cuda: str, image: Image,
             cluster: Cluster) -> Image:
    from skyward_iac.api.spec import PipIndex

    env: dict[str, str] = {"SKYWARD_TORCH_BACKEND": backend or ("nccl" if cluster.gpu else "gloo")}
    index = None
    if cluster.gpu:
        names = tuple(p.split("==")[0] for p in packages)
        index = PipIndex(url=f"{TORCH_INDEX}/{cuda}", packages=names)
        # NCCL must not pick the loopback or a container bridge between hosts.
        env |= {"NCCL_SOCKET_IFNAME": "^lo,docker0", "GLOO_SOCKET_IFNAME": ""}
    elif cluster.spec.provider.on_this_machine:
        # Local nodes are loopback addresses of one machine: gloo talks over lo.
        env |= {"GLOO_SOCKET_IFNAME": "lo"}
    env = {name: value for name, value in env.items() if value}
    return with_packages(image, packages, index=index, env=env)


def torch_environment(info: InstanceInfo) -> AbstractContextManager[Any]:
    """The ``torch.distributed`` variables of this worker (env:// initialisation)."""
    return environment(distributed_env(info))


def distributed_env(info: InstanceInfo) -> dict[str, str]:
    """``MASTER_ADDR``/``MASTER_PORT``/``RANK``/... for ``info``; shared with ``accelerate``."""
    return {
        "MASTER_ADDR": info.head_addr,
        "MASTER_PORT": str(rendezvous_port(info.job_id)),
        "RANK": str(info.global_worker_index),
        "WORLD_SIZE": str(info.total_workers),
        "LOCAL_RANK": str(info.worker),
        "LOCAL_WORLD_SIZE": str(info.workers_per_node),
        "NODE_RANK": str(info.node),
    }
