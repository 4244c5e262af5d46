"""``sky.plugins.jax`` and ``sky.plugins.keras``: JAX (multi-host) and Keras 3 on the nodes."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

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

#: Offset from the torch rendezvous port, so one pool can run both.
JAX_PORT_OFFSET = 1


def jax(*, cuda: str = "cu124", version: str = "latest") -> Plugin:
    """Install JAX and make ``jax.distributed.initialize()`` (no arguments) join every worker
    of the pool: the head is the coordinator.

    On GPU clouds ``jax[cuda12]`` (the major of ``cuda``) is installed, elsewhere the CPU
    build. Each worker gets ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and
    ``JAX_PROCESS_ID``; a cluster environment registered with JAX reads them.
    """
    if not cuda.startswith("cu") or len(cuda) < 4 or not cuda[2:].isdigit():
        raise ValueError(f"jax(cuda=...) names a CUDA build such as 'cu124', got {cuda!r}")
    return (
        Plugin.create("jax")
        .with_image_transform(functools.partial(_install_jax, cuda, version))
        .with_around_process(jax_environment)
        .with_decorator(refreshing_environment(distributed_env))
    )


def _install_jax(cuda: str, version: str, image: Image, cluster: Cluster) -> Image:
    name = f"jax[cuda{cuda[2:4]}]" if cluster.gpu else "jax"
    return with_packages(image, (requirement(name, version),))


def distributed_env(info: InstanceInfo) -> dict[str, str]:
    """The multi-host JAX variables of this worker."""
    port = rendezvous_port(info.job_id, JAX_PORT_OFFSET)
    return {
        "JAX_COORDINATOR_ADDRESS": f"{info.head_addr}:{port}",
        "JAX_NUM_PROCESSES": str(info.total_workers),
        "JAX_PROCESS_ID": str(info.global_worker_index),
    }


@contextlib.contextmanager
def jax_environment(info: InstanceInfo) -> Iterator[None]:
    """Set the variables and register the cluster environment that reads them."""
    with environment(distributed_env(info)):
        from skyward_iac.plugins import _jax_cluster  # noqa: F401 - registers itself with JAX

        yield


KerasBackend = Literal["jax", "torch", "tensorflow"]


def keras(*, backend: KerasBackend = "jax", version: str = "latest") -> Plugin:
    """Install Keras 3 and select its ``backend`` (``KERAS_BACKEND``) on every node.

    The backend framework itself comes from its own plugin (``sky.plugins.jax()`` or
    ``sky.plugins.torch()``) or, for TensorFlow, is installed here.
    """
    if backend not in ("jax", "torch", "tensorflow"):
        raise ValueError(f"keras(backend=...) is 'jax', 'torch' or 'tensorflow', got {backend!r}")
    packages = (requirement("keras", version),
                *(("tensorflow",) if backend == "tensorflow" else ()))
    return Plugin.create("keras").with_image_transform(
        lambda image, cluster: with_packages(image, packages, env={"KERAS_BACKEND": backend}))
