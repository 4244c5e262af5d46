"""The ``Plugin`` type: a name and seven optional hooks, built with ``Plugin.create(name)``.

When each hook runs (see docs/guides/distributed-training.md):

==================  ==========  ============================================================
hook                where       when
==================  ==========  ============================================================
``transform``       client      in ``sky.Compute(...)``, before anything is provisioned
``bootstrap``       client      builds shell steps run on every node after the packages and
                                the project are installed, before the agent starts
``around_client``   client      entered when the pool is ready, left before it is destroyed
``around_app``      node agent  entered once, when the agent first learns its InstanceInfo,
                                before it starts the worker processes (they inherit its env)
``launcher``        node agent  rewrites the command of every worker process it starts
``around_process``  worker      entered once per worker process, before its first task
``decorate``        worker      wraps every task's function
==================  ==========  ============================================================

Several plugins compose in the order given: the first transforms/launches first and its
context is entered first (and left last); its decorator is the outermost.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from skyward_iac.api.errors import PluginError
from skyward_iac.api.runtime import InstanceInfo

if TYPE_CHECKING:
    from skyward_iac.api.spec import Image, Spec
    from skyward_iac.orchestration.pool import Pool


@dataclass(frozen=True, slots=True)
class Cluster:
    """What the client-side hooks know about the pool being built."""

    #: The stack name, also every node's ``InstanceInfo.job_id``.
    name: str
    spec: Spec
    nodes: int

    @property
    def provider(self) -> str:
        """``"local"``, ``"aws"`` or ``"gcp"``."""
        return self.spec.provider.kind

    @property
    def gpu(self) -> bool:
        """Whether the nodes have GPUs (an accelerator was asked for on a cloud)."""
        return self.spec.accelerator is not None and not self.spec.provider.on_this_machine


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    """How the agent starts a worker process: its argv and extra environment."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)

    def wrapped(self, *prefix: str) -> LaunchCommand:
        """The same command run through ``prefix`` (e.g. ``("accelerate", "launch")``)."""
        return dataclasses.replace(self, argv=(*prefix, *self.argv))

    def with_env(self, **env: str) -> LaunchCommand:
        """The same command with more environment variables."""
        return dataclasses.replace(self, env={**self.env, **env})


@dataclass(frozen=True, slots=True)
class LaunchContext:
    """What a launcher knows: the node's InstanceInfo and which worker process this is."""

    instance: InstanceInfo
    worker: int


ImageTransform = Callable[["Image", Cluster], "Image"]
BootstrapOps = Callable[[Cluster], tuple[str, ...]]
TaskDecorator = Callable[[Callable[..., Any]], Callable[..., Any]]
AroundInstance = Callable[[InstanceInfo], AbstractContextManager[Any]]
AroundClient = Callable[["Pool", Cluster], AbstractContextManager[Any]]
Launcher = Callable[[LaunchCommand, LaunchContext], LaunchCommand]

#: Hooks that run on nodes (shipped in the agent's Configure); the others stay on the client.
NODE_HOOKS = ("decorate", "around_app", "around_process", "launcher")


@dataclass(frozen=True, slots=True)
class Plugin:
    """A named set of hooks that prepares nodes and wraps how tasks run on them.

    Build one with ``Plugin.create("name").with_bootstrap(...).with_decorator(...)``; pass it
    in ``sky.Compute(..., plugins=[...])``. ``workers_per_node`` (built-in ``mig``) tells every
    node's ``InstanceInfo`` how many workers it runs.
    """

    name: str
    transform: ImageTransform | None = None
    bootstrap: BootstrapOps | None = None
    decorate: TaskDecorator | None = None
    around_app: AroundInstance | None = None
    around_process: AroundInstance | None = None
    around_client: AroundClient | None = None
    launcher: Launcher | None = None
    workers_per_node: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a plugin needs a non-empty name, got {self.name!r}")
        for hook in (f.name for f in dataclasses.fields(self)):
            value = getattr(self, hook)
            if hook not in ("name", "workers_per_node") and value is not None and not callable(value):
                raise TypeError(f"plugin {self.name!r}: {hook} must be callable, got {value!r}")
        if self.workers_per_node < 1:
            raise ValueError(f"plugin {self.name!r}: workers_per_node must be >= 1")

    @classmethod
    def create(cls, name: str) -> Plugin:
        """A plugin with no hooks yet."""
        return cls(name=name)

    def with_image_transform(self, fn: ImageTransform) -> Plugin:
        """``(Image, Cluster) -> Image``: edit the node image before provisioning."""
        return dataclasses.replace(self, transform=fn)

    def with_bootstrap(self, fn: BootstrapOps) -> Plugin:
        """``Cluster -> tuple[str, ...]``: shell commands run on every node at bootstrap."""
        return dataclasses.replace(self, bootstrap=fn)

    def with_decorator(self, fn: TaskDecorator) -> Plugin:
        """``fn -> fn``: wrap every task's function on the worker."""
        return dataclasses.replace(self, decorate=fn)

    def with_around_app(self, fn: AroundInstance) -> Plugin:
        """``InstanceInfo -> ContextManager``: entered once in the node's agent."""
        return dataclasses.replace(self, around_app=fn)

    def with_around_process(self, fn: AroundInstance) -> Plugin:
        """``InstanceInfo -> ContextManager``: entered once in every worker process."""
        return dataclasses.replace(self, around_process=fn)

    def with_around_client(self, fn: AroundClient) -> Plugin:
        """``(Pool, Cluster) -> ContextManager``: entered on the client while the pool lives."""
        return dataclasses.replace(self, around_client=fn)

    def with_launcher(self, fn: Launcher) -> Plugin:
        """``(LaunchCommand, LaunchContext) -> LaunchCommand``: rewrite worker launches."""
        return dataclasses.replace(self, launcher=fn)

    def for_nodes(self) -> Plugin:
        """This plugin without its client-side hooks: what is shipped to the nodes."""
        return dataclasses.replace(self, transform=None, bootstrap=None, around_client=None)

    @property
    def runs_on_nodes(self) -> bool:
        """Whether any hook runs on the nodes."""
        return any(getattr(self, hook) is not None for hook in NODE_HOOKS)


@contextlib.contextmanager
def blame(plugin: Plugin, hook: str) -> Iterator[None]:
    """Turn an exception raised by ``plugin``'s ``hook`` into a ``PluginError`` naming both."""
    try:
        yield
    except PluginError:
        raise
    except Exception as exc:
        raise PluginError(
            f"plugin {plugin.name!r} failed in its {hook} hook: {type(exc).__name__}: {exc}"
        ) from exc


def check_plugins(value: Any) -> tuple[Plugin, ...]:
    """``Spec.plugins`` as a tuple of ``Plugin``; anything else is refused with its position."""
    if isinstance(value, Plugin):
        value = (value,)
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"plugins must be a list or tuple of sky.plugins.Plugin, got "
                         f"{type(value).__name__}")
    for position, plugin in enumerate(value):
        if not isinstance(plugin, Plugin):
            hint = " (call it: sky.plugins.torch())" if callable(plugin) else ""
            raise ValueError(f"plugins[{position}] is {plugin!r}, not a sky.plugins.Plugin{hint}")
    names = [p.name for p in value]
    if len(set(names)) != len(names):
        raise ValueError(f"plugins must have distinct names, got {names}")
    return tuple(value)
