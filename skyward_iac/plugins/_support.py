"""Small pieces the built-in plugins share: image edits, environment scopes, ports, versions."""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from skyward_iac.api.errors import ConfigError

if TYPE_CHECKING:
    from skyward_iac.api.runtime import InstanceInfo
    from skyward_iac.api.spec import Image, PipIndex

#: Rendezvous ports are picked in [BASE, BASE + SPAN): far from etcd's 2379/2380 and from the
#: ephemeral range the agents bind.
RENDEZVOUS_BASE, RENDEZVOUS_SPAN = 29500, 2000


def rendezvous_port(job_id: str, offset: int = 0) -> int:
    """A port derived from the pool's id: the same on every node, different between pools."""
    return RENDEZVOUS_BASE + (zlib.crc32(job_id.encode()) + offset) % RENDEZVOUS_SPAN


def with_packages(image: Image, packages: Sequence[str], index: PipIndex | None = None,
                  env: Mapping[str, str] | None = None) -> Image:
    """``image`` with more pip packages (skipping ones already listed by name), optionally a
    scoped index for some of them, and more environment variables (the image's win)."""
    listed = {_name(p) for p in image.pip}
    pip = image.pip + tuple(p for p in packages if _name(p) not in listed)
    indexes = image.pip_indexes + ((index,) if index is not None else ())
    return image.model_copy(update={"pip": pip, "pip_indexes": indexes,
                                    "env": {**(env or {}), **image.env}})


def _name(requirement: str) -> str:
    for mark in "=<>!~[; ":
        requirement = requirement.split(mark, 1)[0]
    return requirement.lower().replace("_", "-")


def requirement(name: str, version: str | None) -> str:
    """``name`` pinned to ``version``; ``None`` or ``"latest"`` leaves it unpinned."""
    return name if version in (None, "latest") else f"{name}=={version}"


def client_version(distribution: str, plugin: str) -> str:
    """The version installed on the client (pickles between client and nodes must match)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ConfigError(
            f"sky.plugins.{plugin}(version=None) installs the client's own {distribution} on the "
            f"nodes, but it is not installed here: install it, or pass version='x.y.z'"
        ) from None


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the block, then restore what was there."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def refreshing_environment(
        env_for: Callable[[InstanceInfo], Mapping[str, str]],
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A task decorator setting ``env_for(instance_info())`` before every call: a replaced
    node (a new head address, say) reaches tasks in worker processes that outlive it."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def with_current_environment(*args: Any, **kwargs: Any) -> Any:
            from skyward_iac.api.runtime import instance_info

            if (info := instance_info()) is not None:
                os.environ.update(env_for(info))
            return fn(*args, **kwargs)

        return with_current_environment

    return decorate
