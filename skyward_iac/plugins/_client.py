"""Applying plugins on the client: image transforms, bootstrap steps, ``around_client``, and
packing the node-side hooks for the agents."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from skyward_iac.api.errors import ConfigError
from skyward_iac.api.plugin import Cluster, Plugin, blame
from skyward_iac.node import protocol

if TYPE_CHECKING:
    from skyward_iac.api.options import Worker
    from skyward_iac.api.spec import Spec
    from skyward_iac.orchestration.pool import Pool


def transformed_spec(spec: Spec, name: str, nodes: int) -> Spec:
    """``spec`` with every plugin's image transform applied, in order."""
    image = spec.image
    cluster = Cluster(name, spec, nodes)
    for plugin in spec.plugins:
        if plugin.transform is None:
            continue
        with blame(plugin, "transform"):
            image = plugin.transform(image, cluster)
            if not isinstance(image, type(spec.image)):
                raise ConfigError(f"it must return a sky.Image, got {type(image).__name__}")
    return spec if image is spec.image else spec.model_copy(update={"image": image})


def bootstrap_steps(spec: Spec, name: str, nodes: int) -> tuple[tuple[str, str], ...]:
    """Every plugin's bootstrap commands as named steps (``plugin <name>``), in order."""
    cluster = Cluster(name, spec, nodes)
    steps: list[tuple[str, str]] = []
    for plugin in spec.plugins:
        if plugin.bootstrap is None:
            continue
        with blame(plugin, "bootstrap"):
            ops = plugin.bootstrap(cluster)
            if isinstance(ops, str) or not all(isinstance(op, str) for op in ops):
                raise ConfigError(f"it must return a tuple of shell commands, got {ops!r}")
        label = re.sub(r"[^A-Za-z0-9_.-]", "-", plugin.name)
        steps += [(f"plugin {label}", op) for op in ops]
    return tuple(steps)


def workers_per_node(plugins: Sequence[Plugin]) -> int:
    """How many workers each node runs (``mig`` may ask for several)."""
    return max((p.workers_per_node for p in plugins), default=1)


def check_workers(plugins: Sequence[Plugin], worker: Worker) -> None:
    """Several workers per node need as many worker processes: refuse anything else now."""
    wanted = workers_per_node(plugins)
    if wanted > 1 and (worker.resolved_executor != "process" or worker.concurrency != wanted):
        raise ConfigError(
            f"the plugins ask for {wanted} workers per node (one process each): pass "
            f"options=sky.Options(worker=sky.Worker(concurrency={wanted}, executor=\"process\"))"
        )


def node_plugins(plugins: Sequence[Plugin]) -> bytes | None:
    """The node-side hooks, pickled for the agents' ``Configure`` (None when there are none)."""
    from skyward_iac.remote.calls import ship_module_by_value

    shipped = tuple(p.for_nodes() for p in plugins if p.runs_on_nodes)
    if not shipped:
        return None
    for plugin in shipped:
        for hook in (plugin.decorate, plugin.around_app, plugin.around_process, plugin.launcher):
            if hook is not None:
                ship_module_by_value(hook)
        with blame(plugin, "pickling"):
            protocol.dumps(plugin)
    return protocol.dumps(shipped)


@contextlib.contextmanager
def around_client(plugins: Sequence[Plugin], pool: Pool, cluster: Cluster) -> Iterator[None]:
    """Enter every plugin's ``around_client`` in order (left in reverse order)."""
    with contextlib.ExitStack() as stack:
        for plugin in plugins:
            if plugin.around_client is not None:
                with blame(plugin, "around_client"):
                    stack.enter_context(plugin.around_client(pool, cluster))
        yield
