"""skyward_iac: run Python functions on ephemeral clusters, each pool one Pulumi stack.

``import skyward_iac as sky``; decorate with ``@sky.function``; run inside
``with sky.Compute(provider=sky.Local(), nodes=2) as pool:`` with ``fn(x) >> pool``.

Control-plane names (``Compute``) load the Pulumi and SSH layers lazily, so nodes can import
this package (for the runtime API) without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from skyward_iac.api import accelerators
from skyward_iac.api.errors import (
    BootstrapError,
    ConfigError,
    EngineNotFoundError,
    HostKeyMismatchError,
    NodeConnectionError,
    NoActivePoolError,
    ProvisionError,
    RemoteError,
    SkywardError,
    StackNotFoundError,
)
from skyward_iac.api.function import Function, PendingFunction, function
from skyward_iac.api.providers import AWS, GCP, Local
from skyward_iac.api.spec import Image, Nodes, Options, Spec, Worker

if TYPE_CHECKING:
    from skyward_iac.pool.compute import Compute, Pool

__version__ = "0.1.0"

_LAZY = {"Compute": "skyward_iac.pool.compute", "Pool": "skyward_iac.pool.compute"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'skyward_iac' has no attribute {name!r}")


__all__ = [
    "AWS", "BootstrapError", "Compute", "ConfigError", "EngineNotFoundError", "Function", "GCP",
    "HostKeyMismatchError", "Image", "Local", "NoActivePoolError", "NodeConnectionError", "Nodes",
    "Options", "PendingFunction", "Pool", "ProvisionError", "RemoteError", "SkywardError", "Spec",
    "StackNotFoundError",
    "Worker", "__version__", "accelerators", "function",
]
