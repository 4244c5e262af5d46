"""skyward_iac: run Python functions on ephemeral clusters, each pool one Pulumi stack.

``import skyward_iac as sky``; decorate with ``@sky.function``; run inside
``with sky.Compute(provider=sky.Local(), nodes=2) as pool:`` with ``fn(x) >> pool``.

Every public name is imported on first use (PEP 562): a node's agent, worker, etcd launcher
and the engine's provider host import this package without paying for the whole API
(pydantic models, the Pulumi and SSH layers), about 0.2 s less per process start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from skyward_iac import plugins, storage
    from skyward_iac.api import accelerators, containers, metrics, time
    from skyward_iac.api.containers import DockerImage
    from skyward_iac.api.errors import (
        BootstrapError,
        BucketNotFoundError,
        BudgetExceededError,
        CollectionError,
        CollectionsDisabledError,
        ConfigError,
        EngineNotFoundError,
        HostKeyMismatchError,
        NoActivePoolError,
        NodeConnectionError,
        ObjectNotFoundError,
        OutOfSpaceError,
        PluginError,
        ProvisionError,
        RemoteError,
        SkywardError,
        StackNotFoundError,
        StorageAccessDeniedError,
        StorageError,
        WorkerCrashedError,
    )
    from skyward_iac.api.function import (
        Function,
        PendingFunction,
        PendingFunctionGroup,
        function,
        gather,
    )
    from skyward_iac.api.health import HealthChecker
    from skyward_iac.api.log_config import LogConfig
    from skyward_iac.api.options import Options, Worker
    from skyward_iac.api.providers import AWS, GCP, Local
    from skyward_iac.api.runtime import (
        AcceleratorInfo,
        CallbackWriter,
        InstanceInfo,
        NetworkInfo,
        PeerInfo,
        instance_info,
        is_head,
        redirect_output,
        shard,
        silent,
        stderr,
        stdout,
    )
    from skyward_iac.api.sampler import DistributedSampler
    from skyward_iac.api.spec import Image, Nodes, PipIndex, Spec
    from skyward_iac.api.volumes import Volume
    from skyward_iac.collections.context import barrier, counter, dict, lock, queue, set
    from skyward_iac.orchestration.compute import Compute, MultiPool, Session, pool
    from skyward_iac.orchestration.pool import Pool
    from skyward_iac.storage.client import Storage


__version__ = "0.1.0"

#: Submodules offered as attributes.
_MODULES = {
    "plugins": "skyward_iac.plugins", "accelerators": "skyward_iac.api.accelerators",
    "containers": "skyward_iac.api.containers", "metrics": "skyward_iac.api.metrics",
    "time": "skyward_iac.api.time", "storage": "skyward_iac.storage",
}
#: Every public name and the module it comes from, imported on first use.
_LAZY = {
    **{name: "skyward_iac.api.errors" for name in (
        "BootstrapError", "BucketNotFoundError", "BudgetExceededError", "CollectionError",
        "CollectionsDisabledError", "ConfigError", "EngineNotFoundError", "HostKeyMismatchError", "NoActivePoolError",
        "NodeConnectionError", "ObjectNotFoundError", "OutOfSpaceError", "PluginError",
        "ProvisionError",
        "RemoteError", "SkywardError", "StackNotFoundError", "StorageAccessDeniedError",
        "StorageError", "WorkerCrashedError",
    )},
    **{name: "skyward_iac.api.function" for name in (
        "Function", "PendingFunction", "PendingFunctionGroup", "function", "gather")},
    **{name: "skyward_iac.api.runtime" for name in (
        "AcceleratorInfo", "CallbackWriter", "InstanceInfo", "NetworkInfo", "PeerInfo",
        "instance_info", "is_head", "redirect_output", "shard", "silent", "stderr", "stdout",
    )},
    **{name: "skyward_iac.api.spec" for name in ("Image", "Nodes", "PipIndex", "Spec")},
    **{name: "skyward_iac.api.options" for name in ("Options", "Worker")},
    **{name: "skyward_iac.api.providers" for name in ("AWS", "GCP", "Local")},
    "DockerImage": "skyward_iac.api.containers",
    "HealthChecker": "skyward_iac.api.health",
    "LogConfig": "skyward_iac.api.log_config",
    "DistributedSampler": "skyward_iac.api.sampler",
    "Storage": "skyward_iac.storage.client",
    "Volume": "skyward_iac.api.volumes",
    "Compute": "skyward_iac.orchestration.compute",
    "MultiPool": "skyward_iac.orchestration.compute",
    "Session": "skyward_iac.orchestration.compute",
    "pool": "skyward_iac.orchestration.compute",
    "Pool": "skyward_iac.orchestration.pool",
    **{name: "skyward_iac.observability.events" for name in (
        "Event", "ClusterRequested", "ClusterProvisioned", "ClusterReady", "ClusterDestroyed",
        "InstanceLaunched", "InstanceProvisioned", "InstanceBootstrapped", "InstancePreempted",
        "InstanceReplaced", "InstanceDestroyed", "BootstrapPhase", "BootstrapConsole",
        "TaskQueued", "TaskStarted", "TaskCompleted", "TaskProgress", "Metric", "Log", "Error",
        "CollectionsLost", "StackProgress", "StackPreviewed", "StackUpdated", "StackDestroyed",
        "ProvisionRetried", "BudgetWarning", "BudgetExceeded",
    )},
    # The collections load the etcd client (gRPC) only when first used.
    **{name: "skyward_iac.collections.context"
       for name in ("dict", "set", "counter", "queue", "barrier", "lock")},
}


def __getattr__(name: str) -> Any:
    import importlib

    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'skyward_iac' has no attribute {name!r}")
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "DistributedSampler", "PluginError", "plugins",
    "AWS", "AcceleratorInfo", "DockerImage", "containers", "BootstrapError", "CallbackWriter", "Compute", "ConfigError",
    "EngineNotFoundError", "Function", "GCP", "HealthChecker", "HostKeyMismatchError", "Image",
    "InstanceInfo",
    "Local", "MultiPool", "NetworkInfo", "NoActivePoolError", "NodeConnectionError", "Nodes",
    "Options", "PeerInfo", "PendingFunction", "PendingFunctionGroup", "PipIndex", "Pool",
    "ProvisionError",
    "RemoteError", "Session", "SkywardError", "Spec", "StackNotFoundError", "Worker",
    "WorkerCrashedError", "__version__", "accelerators", "function", "gather", "instance_info",
    "is_head", "pool", "redirect_output", "shard", "silent", "stderr", "stdout", "time",
    "dict", "set", "counter", "queue", "barrier", "lock", "CollectionError",
    "CollectionsDisabledError", "Storage", "Volume", "storage", "StorageError",
    "BucketNotFoundError", "ObjectNotFoundError", "StorageAccessDeniedError", "metrics",
    "LogConfig", "Event", "ClusterRequested", "ClusterProvisioned", "ClusterReady",
    "ClusterDestroyed", "InstanceLaunched", "InstanceProvisioned", "InstanceBootstrapped",
    "InstancePreempted", "InstanceReplaced", "InstanceDestroyed", "BootstrapPhase",
    "BootstrapConsole", "TaskQueued", "TaskStarted", "TaskCompleted", "TaskProgress", "Metric",
    "Log", "Error", "CollectionsLost",
    "StackProgress", "StackPreviewed", "StackUpdated", "StackDestroyed", "ProvisionRetried",
    "BudgetWarning", "BudgetExceeded", "BudgetExceededError", "OutOfSpaceError",
]
