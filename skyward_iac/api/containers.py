"""Container images a node's agent can run in: ``sky.containers.cuda("12.8")``, ...

A provider's ``container_image=`` takes one of these (or a plain reference string). The node
then runs the bootstrap and the agent inside that image with Docker, with the host's network
and, on GPU nodes, its GPUs (``remote/container.py``). Every factory returns a pinned tag: a
version it does not know is a ``ConfigError`` listing the ones it does, never ``latest``.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import field_validator

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.model import UserModel

CudaVariant = Literal["base", "runtime", "devel", "cudnn-runtime", "cudnn-devel"]

#: CUDA minor -> the newest patch release NVIDIA publishes images for (nvidia/cuda on Docker Hub).
CUDA_PATCHES = {"12.4": "12.4.1", "12.6": "12.6.3", "12.8": "12.8.1", "12.9": "12.9.1"}
#: Ubuntu releases each CUDA minor has images for.
CUDA_UBUNTU = {"12.4": ("22.04", "20.04"), "12.6": ("24.04", "22.04", "20.04"),
               "12.8": ("24.04", "22.04", "20.04"), "12.9": ("24.04", "22.04", "20.04")}
#: PyTorch minor -> (NGC container release, its CUDA).
PYTORCH_NGC = {"2.6": ("24.11", "12.6"), "2.7": ("25.03", "12.8"), "2.8": ("25.04", "12.9")}
#: PyTorch minor -> (RunPod's pytorch image tag, its CUDA).
RUNPOD_PYTORCH = {
    "2.6": ("2.6.0-py3.12-cuda12.6.3-devel-ubuntu24.04", "12.6"),
    "2.7": ("2.7.0-py3.13-cuda12.8.1-devel-ubuntu24.04", "12.8"),
    "2.8": ("2.8.0-py3.13-cuda12.8.1-devel-ubuntu24.04", "12.8"),
}
UBUNTU_RELEASES = ("20.04", "22.04", "24.04")

#: A Docker image reference: [registry[:port]/]path[:tag][@sha256:digest], lowercase path.
_REFERENCE = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::\d+)?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)


class DockerImage(UserModel):
    """A container image reference, with the CUDA and Ubuntu it carries when known."""

    positional = ("tag",)

    tag: str
    cuda: str | None = None
    ubuntu: str | None = None

    @field_validator("tag")
    @classmethod
    def _reference(cls, value: str) -> str:
        if not _REFERENCE.match(value):
            raise ValueError(f"{value!r} is not a Docker image reference such as "
                             "'nvidia/cuda:12.8.1-runtime-ubuntu24.04'")
        return value

    def __str__(self) -> str:
        return self.tag

    @classmethod
    def of(cls, tag: str, *, cuda: str | None = None, ubuntu: str | None = None) -> DockerImage:
        """Any image by its reference (``"ghcr.io/me/train:1.4"``), with optional metadata."""
        return cls(tag=tag, cuda=cuda, ubuntu=ubuntu)


def cuda(version: str = "12.8", *, variant: CudaVariant = "runtime",
         ubuntu: str = "24.04") -> DockerImage:
    """NVIDIA's CUDA image: ``nvidia/cuda:<X.Y.Z>-<variant>-ubuntu<ubuntu>``.

    ``version`` is a minor (``"12.8"``, its newest patch) or a full ``"12.8.0"``."""
    minor = ".".join(version.split(".")[:2])
    patch = version if version.count(".") == 2 else CUDA_PATCHES.get(version)
    if patch is None:
        raise ConfigError(f"unknown CUDA version {version!r}; known: "
                          f"{', '.join(CUDA_PATCHES)} (or give the full X.Y.Z)")
    if variant not in CudaVariant.__args__:  # type: ignore[attr-defined]
        raise ConfigError(f"CUDA image variant must be one of "
                          f"{', '.join(CudaVariant.__args__)}, got {variant!r}")  # type: ignore[attr-defined]
    if minor in CUDA_UBUNTU and ubuntu not in CUDA_UBUNTU[minor]:
        raise ConfigError(f"CUDA {minor} images come for Ubuntu "
                          f"{', '.join(CUDA_UBUNTU[minor])}, not {ubuntu}")
    return DockerImage(tag=f"nvidia/cuda:{patch}-{variant}-ubuntu{ubuntu}", cuda=minor,
                       ubuntu=ubuntu)


def ubuntu(version: str = "24.04") -> DockerImage:
    """The plain Ubuntu image (CPU nodes, or a GPU node whose Image installs its own CUDA)."""
    if version not in UBUNTU_RELEASES:
        raise ConfigError(f"Ubuntu release must be one of {', '.join(UBUNTU_RELEASES)}, "
                          f"got {version!r}")
    return DockerImage(tag=f"ubuntu:{version}", ubuntu=version)


def pytorch(version: str = "2.8", *, cuda: str | None = None) -> DockerImage:
    """NVIDIA's NGC PyTorch image for a PyTorch minor: ``nvcr.io/nvidia/pytorch:<YY.MM>-py3``.

    ``cuda`` only records a different CUDA; the release fixes the one inside."""
    release = _known("PyTorch", version, PYTORCH_NGC)
    return DockerImage(tag=f"nvcr.io/nvidia/pytorch:{release[0]}-py3", cuda=cuda or release[1])


def runpod_pytorch(version: str = "2.8", *, cuda: str | None = None) -> DockerImage:
    """RunPod's PyTorch image for a PyTorch minor (``runpod/pytorch:...``)."""
    tag, bundled = _known("PyTorch", version, RUNPOD_PYTORCH)
    return DockerImage(tag=f"runpod/pytorch:{tag}", cuda=cuda or bundled,
                       ubuntu=tag.rsplit("ubuntu", 1)[1])


def _known(what: str, version: str, table: dict[str, tuple[str, str]]) -> tuple[str, str]:
    if version not in table:
        raise ConfigError(f"no pinned image for {what} {version!r}; known: {', '.join(table)} "
                          "(use sky.DockerImage.of('repo:tag') for any other image)")
    return table[version]


def image_reference(value: DockerImage | str | None) -> DockerImage | None:
    """A provider's ``container_image`` as a ``DockerImage`` (strings are references)."""
    if value is None or isinstance(value, DockerImage):
        return value
    if isinstance(value, str):
        return DockerImage(tag=value)
    raise ConfigError(f"container_image must be a sky.DockerImage or a reference string, "
                      f"got {type(value).__name__}")


__all__ = ["CudaVariant", "DockerImage", "cuda", "image_reference", "pytorch",
           "runpod_pytorch", "ubuntu"]
