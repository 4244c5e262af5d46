"""GPU sharing and GPU libraries: ``sky.plugins.mig``, ``sky.plugins.mps``, ``sky.plugins.cuml``.

They configure NVIDIA machinery (MIG partitions, the MPS daemon, RAPIDS); on nodes without an
NVIDIA GPU their bootstrap steps fail with nvidia-smi's own message.
"""

from __future__ import annotations

import contextlib
import functools
import re
import shlex
import subprocess
from collections.abc import Iterator
from typing import TYPE_CHECKING

from skyward_iac.api.plugin import Cluster, Plugin
from skyward_iac.api.runtime import InstanceInfo
from skyward_iac.plugins._support import environment, requirement, with_packages

if TYPE_CHECKING:
    from skyward_iac.api.spec import Image

#: MIG profile -> instances one GPU holds (A100 40/80 GB, H100/H200 80-141 GB).
MIG_PROFILES = {
    "1g.5gb": 7, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1,
    "1g.10gb": 7, "1g.12gb": 7, "1g.18gb": 7, "1g.20gb": 4, "2g.20gb": 3, "2g.24gb": 3,
    "2g.35gb": 3, "3g.40gb": 2, "3g.47gb": 2, "3g.71gb": 2, "4g.40gb": 1, "4g.47gb": 1,
    "4g.71gb": 1, "7g.80gb": 1, "7g.94gb": 1, "7g.141gb": 1,
}
MPS_PIPE = "/tmp/nvidia-mps"
MPS_LOG = "/tmp/nvidia-mps-log"
RAPIDS_INDEX = "https://pypi.nvidia.com"


def mig(profile: str) -> Plugin:
    """Split each node's GPU into MIG instances of ``profile`` (e.g. ``"3g.40gb"``), one
    worker each: ``InstanceInfo.workers_per_node`` is the instance count, and worker ``i``
    sees only MIG device ``i`` (``CUDA_VISIBLE_DEVICES``). Run one process per instance:
    ``Options(worker=sky.Worker(concurrency=<count>, executor="process"))``.
    """
    if profile not in MIG_PROFILES:
        raise ValueError(f"mig({profile!r}): unknown MIG profile; known: {sorted(MIG_PROFILES)}")
    count = MIG_PROFILES[profile]
    instances = ",".join([profile] * count)
    ops = ("nvidia-smi -i 0 -mig 1",
           "nvidia-smi mig -i 0 -dci 2>/dev/null || true; nvidia-smi mig -i 0 -dgi 2>/dev/null || true",
           f"nvidia-smi mig -i 0 -cgi {shlex.quote(instances)} -C")
    return Plugin(name="mig", bootstrap=lambda cluster: ops, around_process=mig_device,
                  workers_per_node=count)


@contextlib.contextmanager
def mig_device(info: InstanceInfo) -> Iterator[None]:
    """Show this worker only its own MIG instance."""
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True)
    devices = mig_uuids(listing.stdout)
    if info.worker >= len(devices):
        raise RuntimeError(f"worker {info.worker} has no MIG instance (nvidia-smi lists "
                           f"{len(devices)})")
    with environment({"CUDA_VISIBLE_DEVICES": devices[info.worker]}):
        yield


def mig_uuids(listing: str) -> list[str]:
    """The MIG device UUIDs in ``nvidia-smi -L`` output, in order."""
    return re.findall(r"\(UUID: (MIG-[0-9a-fA-F-]+)\)", listing)


def mps(*, active_thread_percentage: int | None = None,
        pinned_memory_limit: str | None = None) -> Plugin:
    """Start the CUDA MPS daemon on every node so concurrent tasks share the GPU.

    ``active_thread_percentage`` caps each client's share of the SMs (1-100);
    ``pinned_memory_limit`` caps its device memory (e.g. ``"8G"``, applied to GPU 0 as
    ``0=8G``; several GPUs: ``"0=8G,1=8G"``).
    """
    if active_thread_percentage is not None and not 1 <= active_thread_percentage <= 100:
        raise ValueError(f"mps(active_thread_percentage={active_thread_percentage}): 1-100")
    if pinned_memory_limit is not None and not re.fullmatch(
            r"(\d+=)?\d+[KMG]?(,\d+=\d+[KMG]?)*", pinned_memory_limit):
        raise ValueError(f"mps(pinned_memory_limit={pinned_memory_limit!r}): like '8G' or '0=8G'")
    return (
        Plugin.create("mps")
        .with_bootstrap(lambda cluster: (
            f"mkdir -p {MPS_PIPE} {MPS_LOG}",
            f"CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE} CUDA_MPS_LOG_DIRECTORY={MPS_LOG} "
            "nvidia-cuda-mps-control -d",
        ))
        .with_around_process(functools.partial(_mps_client, mps_env(
            active_thread_percentage, pinned_memory_limit)))
    )


def mps_env(active_thread_percentage: int | None, pinned_memory_limit: str | None) -> dict[str, str]:
    """What an MPS client process needs in its environment."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": MPS_PIPE, "CUDA_MPS_LOG_DIRECTORY": MPS_LOG}
    if active_thread_percentage is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(active_thread_percentage)
    if pinned_memory_limit is not None:
        limit = pinned_memory_limit if "=" in pinned_memory_limit else f"0={pinned_memory_limit}"
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = limit
    return env


def _mps_client(env: dict[str, str], info: InstanceInfo) -> contextlib.AbstractContextManager[None]:
    return environment(env)


def cuml(*, cuda: str = "cu12", version: str = "latest") -> Plugin:
    """Install RAPIDS cuML for ``cuda`` (``cuml-cu12`` from NVIDIA's index) and turn on
    ``cuml.accel`` in every worker, so scikit-learn estimators run on the GPU unchanged."""
    if cuda not in ("cu11", "cu12", "cu13"):
        raise ValueError(f"cuml(cuda=...) is 'cu11', 'cu12' or 'cu13', got {cuda!r}")
    package = f"cuml-{cuda}"
    return (
        Plugin.create("cuml")
        .with_image_transform(functools.partial(_install_cuml, package, version))
        .with_around_process(_cuml_accel)
    )


def _install_cuml(package: str, version: str, image: Image, cluster: Cluster) -> Image:
    from skyward_iac.api.spec import PipIndex

    index = PipIndex(url=RAPIDS_INDEX, packages=(package,))
    return with_packages(image, (requirement(package, version),), index=index)


@contextlib.contextmanager
def _cuml_accel(info: InstanceInfo) -> Iterator[None]:
    import cuml.accel  # type: ignore[import-not-found]

    cuml.accel.install()
    yield
