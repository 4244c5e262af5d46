"""Applying plugins on a node: ``around_app`` and ``launcher`` in the agent, ``around_process``
and ``decorate`` in each worker process. Imported by the agent and its workers only."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from skyward_iac.api.errors import PluginError
from skyward_iac.api.plugin import LaunchCommand, LaunchContext, Plugin, blame
from skyward_iac.api.runtime import InstanceInfo
from skyward_iac.node import protocol


class NodePlugins:
    """The plugins of a node, with the contexts they entered (kept open for the process's life)."""

    def __init__(self, plugins: Sequence[Plugin]) -> None:
        self.plugins = tuple(plugins)
        self._scope = contextlib.ExitStack()
        #: Set when the plugins could not start in this process: every task raises it.
        self.failure: PluginError | None = None

    @classmethod
    def load(cls, pickled: bytes | None) -> NodePlugins:
        """Rebuild the plugins shipped in ``Configure.plugins``."""
        return cls(protocol.loads(pickled) if pickled else ())

    @property
    def changes_launch(self) -> bool:
        """Whether worker processes must start after ``enter_app`` (new env or command)."""
        return any(p.around_app is not None or p.launcher is not None for p in self.plugins)

    def enter_app(self, instance: InstanceInfo) -> None:
        """The agent: enter every ``around_app``; raises ``PluginError`` naming the culprit."""
        self._enter("around_app", instance)

    def enter_process(self, instance: InstanceInfo) -> None:
        """A worker process: enter every ``around_process``."""
        self._enter("around_process", instance)

    def _enter(self, hook: str, instance: InstanceInfo) -> None:
        for plugin in self.plugins:
            around = getattr(plugin, hook)
            if around is not None:
                with blame(plugin, hook):
                    self._scope.enter_context(around(instance))

    def close(self) -> None:
        """Leave the entered contexts, last first; errors are swallowed (the process is ending)."""
        try:
            self._scope.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass

    def launch(self, command: LaunchCommand, context: LaunchContext) -> LaunchCommand:
        """The worker command after every launcher, in order."""
        for plugin in self.plugins:
            if plugin.launcher is not None:
                with blame(plugin, "launcher"):
                    command = plugin.launcher(command, context)
                    if not isinstance(command, LaunchCommand):
                        raise TypeError(f"it must return a LaunchCommand, got {command!r}")
        return command

    def decorate(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` wrapped by every decorator; the first plugin's is the outermost."""
        if self.failure is not None:
            raise self.failure
        for plugin in reversed(self.plugins):
            if plugin.decorate is not None:
                with blame(plugin, "decorate"):
                    fn = plugin.decorate(fn)
                    if not callable(fn):
                        raise TypeError(f"it must return a callable, got {fn!r}")
        return fn


def start_in_process(pickled: bytes, instance: InstanceInfo) -> NodePlugins:
    """A worker process: load the plugins and enter their ``around_process``; never raises (a
    failure is kept and raised by every task instead, so the client hears of it)."""
    try:
        plugins = NodePlugins.load(pickled)
    except Exception as exc:  # noqa: BLE001 - reported through the tasks
        plugins = NodePlugins(())
        plugins.failure = PluginError(f"the pool's plugins could not be loaded on node "
                                      f"{instance.node}: {type(exc).__name__}: {exc}")
        return plugins
    try:
        plugins.enter_process(instance)
    except PluginError as exc:
        plugins.failure = exc
    return plugins
